"""Server commands: ``serve`` (gateway and node in one process), ``gateway``, ``node``, and
``db upgrade``. Each builds its settings from ``CORRAL_*`` variables; flags override them."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import click
from pydantic import ValidationError

from common import lograte

if TYPE_CHECKING:  # server settings are imported by the command that needs them
    from app.settings import Settings


def _settings(**overrides: Any) -> Settings:
    from app.settings import Settings

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise click.UsageError("; ".join(e["msg"] for e in exc.errors())) from None


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # httpx logs every request at INFO: the gateways' calls to nodes (a reconciler pass
    # each second, every sandbox operation) would drown the server's own lines
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))
    lograte.install()  # a flood of one line (a tenant's calls, each refused) is summarised


_host = click.option("--host", default=None, help="Listen address [CORRAL_HOST, 127.0.0.1].")
_port = click.option("--port", type=int, default=None, help="Listen port [CORRAL_PORT, 8080].")
_log = click.option("--log-level", default="info", show_default=True)


@click.command()
@_host
@_port
@_log
def serve(host: str | None, port: int | None, log_level: str) -> None:
    """Run the gateway and one node agent in one process (the embedded default).

    With no CORRAL_REDIS_URL the dispatch is in-process and the database a SQLite file
    under CORRAL_DATA_DIR; set both CORRAL_DATABASE_URL and CORRAL_REDIS_URL to let other
    gateways and nodes join.
    """
    _serve(_settings(host=host, port=port), with_node=True, log_level=log_level)


@click.command()
@_host
@_port
@_log
def gateway(host: str | None, port: int | None, log_level: str) -> None:
    """Run the gateway (control plane) alone; nodes join through CORRAL_REDIS_URL."""
    settings = _settings(host=host, port=port)
    if not settings.redis_url:
        raise click.UsageError("a separate gateway needs CORRAL_REDIS_URL to reach its nodes")
    _serve(settings, with_node=False, log_level=log_level)


def _serve(settings: Settings, *, with_node: bool, log_level: str) -> None:
    """The API listener in the foreground (uvicorn; proxy headers only from
    CORRAL_TRUSTED_PROXIES); the app's lifespan runs the keyless listener, if any."""
    import uvicorn

    from app.http.listeners import api_config
    from app.main import create_app

    _logging(log_level)
    app = create_app(settings, with_node=with_node)
    uvicorn.Server(
        api_config(app, settings, log_level=log_level, timeout_graceful_shutdown=15)
    ).run()


@click.command()
@_log
@click.option("--slots", type=int, default=None, help="Executions at once [CORRAL_NODE_SLOTS].")
@click.option(
    "--node-port", type=int, default=None, help="Port of /healthz and /metrics [CORRAL_NODE_PORT]."
)
def node(log_level: str, slots: int | None, node_port: int | None) -> None:
    """Run a node agent (data plane) alone. It needs only CORRAL_REDIS_URL: it takes work
    from there, runs it on its backends (CORRAL_RUNTIMES) and reports results there; it
    holds no database URL and no admin key. /healthz and /metrics on CORRAL_NODE_PORT."""
    from node.agent.main import run_node
    from node.settings import NodeSettings

    overrides: dict[str, Any] = {"node_slots": slots, "node_port": node_port}
    try:
        settings = NodeSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise click.UsageError("; ".join(e["msg"] for e in exc.errors())) from None
    if not settings.redis_url:
        raise click.UsageError("a separate node needs CORRAL_REDIS_URL to reach the gateways")
    _logging(log_level)
    asyncio.run(run_node(settings))


# --- database -----------------------------------------------------------------------------
@click.group()
def db() -> None:
    """Database schema commands."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision: str) -> None:
    """Apply migrations up to REVISION on CORRAL_DATABASE_URL (or the embedded SQLite)."""
    from app.db import files
    from app.db.engine import make_engine
    from app.db.migrate import upgrade
    from app.settings import DatabaseSettings

    settings = DatabaseSettings()

    async def go() -> None:
        files.prepare(settings.data_dir, settings.resolved_database_url)
        engine = make_engine(settings.resolved_database_url)
        try:
            await upgrade(engine, revision)
        finally:
            await engine.dispose()

    asyncio.run(go())
    click.echo(f"database at {revision}")


COMMANDS: list[click.Command] = [serve, gateway, node, db]
