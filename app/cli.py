"""The ``corral`` command.

Server commands build one ``Settings`` from ``CORRAL_*`` variables (flags override
them); client commands talk HTTP to ``CORRAL_URL`` with ``CORRAL_API_KEY`` (tenant
commands) or ``CORRAL_ADMIN_KEY`` (admin commands).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import logging
import posixpath
import re
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import click
import httpx
from pydantic import ValidationError

from corral import Conflict, Corral, CorralError, Files, NotFound, SandboxInfo
from wire import lograte

if TYPE_CHECKING:  # server settings are imported by the command that needs them
    from app.settings import Settings
    from runtimes.images import Image, ImageStore, Progress

DEFAULT_URL = "http://127.0.0.1:8080"


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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Corral: sandboxes and function execution for training AI agents."""


# --- servers ------------------------------------------------------------------------------
_host = click.option("--host", default=None, help="Listen address [CORRAL_HOST, 127.0.0.1].")
_port = click.option("--port", type=int, default=None, help="Listen port [CORRAL_PORT, 8080].")
_log = click.option("--log-level", default="info", show_default=True)


@main.command()
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


@main.command()
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


@main.command()
@_log
@click.option("--slots", type=int, default=None, help="Executions at once [CORRAL_NODE_SLOTS].")
@click.option(
    "--node-port", type=int, default=None, help="Port of /healthz and /metrics [CORRAL_NODE_PORT]."
)
def node(log_level: str, slots: int | None, node_port: int | None) -> None:
    """Run a node agent (data plane) alone. It needs only CORRAL_REDIS_URL: it takes work
    from there, runs it on its backends (CORRAL_RUNTIMES) and reports results there; it
    holds no database URL and no admin key. /healthz and /metrics on CORRAL_NODE_PORT."""
    from runtimes.node.main import run_node
    from runtimes.node.settings import NodeSettings

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
@main.group()
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


# --- client commands ----------------------------------------------------------------------
_url = click.option(
    "--url",
    envvar="CORRAL_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="Server URL [CORRAL_URL].",
)
_admin = click.option(
    "--admin-key", envvar="CORRAL_ADMIN_KEY", required=True, help="Admin key [CORRAL_ADMIN_KEY]."
)
_key = click.option(
    "--api-key", envvar="CORRAL_API_KEY", default=None, help="Tenant API key [CORRAL_API_KEY]."
)


def _request(url: str, key: str | None, method: str, path: str, body: Any = None) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with httpx.Client(base_url=url, timeout=httpx.Timeout(10.0, read=3600.0)) as client:
            response = client.request(method, path, json=body, headers=headers)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from None
    if response.status_code < 400 and response.headers.get("content-type", "").startswith(
        "text/csv"
    ):
        return response.text
    try:
        data = response.json() if response.content else None
    except ValueError:
        raise click.ClickException(
            f"{response.status_code} from {url}: not a Corral answer: {response.text[:200]!r}"
        ) from None
    if response.status_code >= 400:
        err = (data or {}).get("error", {})
        raise click.ClickException(
            f"{response.status_code} {err.get('code', '?')}: {err.get('message', response.text)}"
        )
    return data


def _echo(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


@main.group()
def tenant() -> None:
    """Manage tenants (admin)."""


@tenant.command("create")
@click.argument("name")
@click.option(
    "--quota",
    "quota",
    multiple=True,
    metavar="FIELD=VALUE",
    help="A quota, e.g. --quota max_concurrent_executions=64 (repeatable).",
)
@_url
@_admin
def tenant_create(name: str, quota: tuple[str, ...], url: str, admin_key: str) -> None:
    """Create tenant NAME and print it with its first API key (shown once)."""
    quotas = {}
    for item in quota:
        field, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not FIELD=VALUE", param_hint="--quota")
        quotas[field] = value
    _echo(_request(url, admin_key, "POST", "/v1/tenants", {"name": name, "quota": quotas}))


@tenant.command("list")
@_url
@_admin
def tenant_list(url: str, admin_key: str) -> None:
    """List tenants."""
    _echo(_request(url, admin_key, "GET", "/v1/tenants"))


@main.command()
@click.option("--start", default=None, help="From (ISO 8601 with a timezone) [24 h before end].")
@click.option("--end", default=None, help="Until (ISO 8601 with a timezone) [now].")
@click.option(
    "--group-by",
    default="tenant,day",
    show_default=True,
    help="Comma-separated: tenant, backend, language, function, kind, hour, day.",
)
@click.option("--tenant", default=None, help="One tenant's id (with the admin key).")
@click.option(
    "--format",
    "output",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
)
@_url
@click.option(
    "--api-key",
    envvar=["CORRAL_API_KEY", "CORRAL_ADMIN_KEY"],
    required=True,
    help="A tenant's key (its own usage) or the admin key (everyone's) "
    "[CORRAL_API_KEY, CORRAL_ADMIN_KEY].",
)
def usage(
    start: str | None,
    end: str | None,
    group_by: str,
    tenant: str | None,
    output: str,
    url: str,
    api_key: str,
) -> None:
    """Use and cost over a time range, grouped (GET /v1/usage)."""
    params = {"group_by": group_by, "start": start, "end": end, "tenant": tenant}
    query = urlencode({k: v for k, v in params.items() if v is not None})
    if output == "csv":
        click.echo(_request(url, api_key, "GET", f"/v1/usage?{query}&format=csv"), nl=False)
        return
    report = _request(url, api_key, "GET", f"/v1/usage?{query}")
    if output == "json":
        _echo(report)
        return
    click.echo(usage_table(report))


def usage_table(report: dict[str, Any]) -> str:
    """A usage report as an aligned text table, its total last."""
    groups: list[str] = report["group_by"]
    columns = [
        *groups,
        "events",
        "failures",
        "cpu_s",
        "memory_gb_s",
        "instance_hours",
        "stored_gb_hours",
        "queue_share",
        "setup_share",
        "exec_share",
        "cost",
    ]
    shown = [
        *(r["group"] | {k: v for k, v in r.items() if k != "group"} for r in report["rows"]),
        {**report["total"], **dict.fromkeys(groups, ""), groups[0]: "total"},
    ]

    def cell(row: dict[str, Any], column: str) -> str:
        value = row[column]
        if column.endswith("_share"):
            return f"{value * 100:.1f}%"
        if column == "cost":
            return f"{value:.6f}"
        if isinstance(value, float):
            return f"{value:.3f}"
        return str(value)

    cells = [[cell(row, c) for c in columns] for row in shown]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    lines.append(f"{report['start']} .. {report['end']}, {report['currency']}")
    return "\n".join(lines)


@main.group()
def key() -> None:
    """Manage a tenant's API keys (admin)."""


@key.command("create")
@click.argument("tenant_id")
@click.option("--name", default="", help="A label for the key.")
@_url
@_admin
def key_create(tenant_id: str, name: str, url: str, admin_key: str) -> None:
    """Create an API key for TENANT_ID and print it (shown once)."""
    _echo(_request(url, admin_key, "POST", f"/v1/tenants/{tenant_id}/keys", {"name": name}))


@key.command("revoke")
@click.argument("tenant_id")
@click.argument("key_id")
@_url
@_admin
def key_revoke(tenant_id: str, key_id: str, url: str, admin_key: str) -> None:
    """Revoke KEY_ID of TENANT_ID."""
    _echo(_request(url, admin_key, "DELETE", f"/v1/tenants/{tenant_id}/keys/{key_id}"))


@main.command()
@click.option("-l", "--language", required=True, help="python, bash, cpp, nodejs, ...")
@click.option("-c", "--code", default=None, help="The source, instead of FILE.")
@click.argument(
    "file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=False
)
@click.option(
    "--stdin",
    "stdin_file",
    type=click.File("r"),
    default=None,
    help="File whose content is the program's standard input ('-' for ours).",
)
@click.option("--timeout", type=float, default=10.0, show_default=True, help="Run timeout, s.")
@click.option("--memory", type=int, default=None, help="Memory limit, MB.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole result as JSON.")
@_url
@_key
def run(
    language: str,
    code: str | None,
    file: Path | None,
    stdin_file: Any,
    timeout: float,
    memory: int | None,
    as_json: bool,
    url: str,
    api_key: str | None,
) -> None:
    """Send code to a Corral server, run it once and print its output.

    Exits with the program's exit code (1 if it did not finish, 2 on a platform error).
    """
    if (code is None) == (file is None):
        raise click.UsageError("give exactly one of -c CODE or FILE")
    source = code if code is not None else file.read_text()  # type: ignore[union-attr]
    body: dict[str, Any] = {"language": language, "code": source, "run_timeout": timeout}
    if stdin_file is not None:
        body["stdin"] = stdin_file.read()
    if memory is not None:
        body["memory_limit_mb"] = memory
    result = _request(url, api_key, "POST", "/v1/run", body)
    if as_json:
        _echo(result)
    else:
        for stage in ("compile", "run"):
            part = result.get(stage) or {}
            if part.get("stdout"):
                sys.stdout.write(part["stdout"])
            if part.get("stderr"):
                sys.stderr.write(part["stderr"])
            if part and part.get("status") != "finished":
                click.echo(
                    f"[{stage}: {part.get('status')}: {part.get('message') or ''}]", err=True
                )
        if result.get("error"):
            click.echo(f"[error: {result['error']}]", err=True)
    if result["status"] == "errored":
        sys.exit(2)
    last: dict[str, Any] = result.get("run") or result.get("compile") or {}
    if last.get("status") == "finished" and isinstance(last.get("exit_code"), int):
        sys.exit(last["exit_code"])
    sys.exit(1)


# --- tool functions -----------------------------------------------------------------------
@main.group()
def functions() -> None:
    """Register and invoke tool functions (tenant)."""


def _manifest(directory: Path) -> dict[str, Any]:
    """The manifest of a function directory: function.json or corral.toml."""
    json_file, toml_file = directory / "function.json", directory / "corral.toml"
    if json_file.is_file():
        data = json.loads(json_file.read_text())
    elif toml_file.is_file():
        import tomllib

        data = tomllib.loads(toml_file.read_text())
    else:
        raise click.UsageError(f"{directory} has no function.json or corral.toml")
    if not isinstance(data, dict) or "name" not in data or "source" not in data:
        raise click.UsageError("the manifest needs at least 'name' and 'source'")
    return data


def _build_module(directory: Path, manifest: dict[str, Any], module: Path) -> None:
    """Compile ``c_source`` to ``module`` with clang for wasm32-wasi."""
    import shutil
    import subprocess

    c_source = manifest.get("c_source")
    if not c_source:
        raise click.UsageError(f"{module} is missing and the manifest names no c_source")
    clang = shutil.which("clang")
    if clang is None:
        raise click.ClickException("clang is needed to build the module (scripts/setup-wasm.sh)")
    command = [clang, "--target=wasm32-wasi", "-O2", "-o", str(module), str(directory / c_source)]
    click.echo(" ".join(command), err=True)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise click.ClickException(f"clang failed:\n{done.stderr}")


@functions.command("deploy")
@click.argument(
    "directory", type=click.Path(exists=True, file_okay=False, path_type=Path), default="."
)
@_url
@_key
def functions_deploy(directory: Path, url: str, api_key: str | None) -> None:
    """Register the function in DIRECTORY (its manifest and source) as a new version."""
    import base64

    manifest = _manifest(directory)
    source = directory / str(manifest["source"])
    body: dict[str, Any] = {
        k: manifest[k]
        for k in ("name", "language", "entry_point", "input_schema", "limits")
        if k in manifest
    }
    if manifest.get("language") == "wasm":
        if not source.is_file():
            _build_module(directory, manifest, source)
        body["module_base64"] = base64.b64encode(source.read_bytes()).decode("ascii")
    else:
        if not source.is_file():
            raise click.UsageError(f"{source} does not exist")
        body["code"] = source.read_text()
    result = _request(url, api_key, "POST", "/v1/functions", body)
    version = result["version"]
    state = "registered" if result["created"] else "unchanged, still"
    click.echo(
        f"{result['function']['name']}: {state} version {version['version']} "
        f"({version['language']}, sha256 {version['content_hash'][:12]})"
    )


@functions.command("list")
@_url
@_key
def functions_list(url: str, api_key: str | None) -> None:
    """List the tenant's functions."""
    _echo(_request(url, api_key, "GET", "/v1/functions"))


@functions.command("invoke")
@click.argument("name")
@click.option("--input", "input_text", default="{}", show_default=True, help="The input, as JSON.")
@click.option("--version", default=None, help="A version number or alias [latest].")
@_url
@_key
def functions_invoke(
    name: str, input_text: str, version: str | None, url: str, api_key: str | None
) -> None:
    """Invoke function NAME and print its result; exits 1 unless it succeeded."""
    try:
        value = json.loads(input_text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--input") from None
    path = f"/v1/functions/{name}/invoke"
    if version is not None:
        path = f"/v1/functions/{name}/versions/{version}/invoke"
    result = _request(url, api_key, "POST", path, value)
    _echo(result)
    if result.get("status") != "succeeded":
        sys.exit(1)


# --- images -------------------------------------------------------------------------------
@main.group()
def images() -> None:
    """Build, import, list and remove this machine's container images
    [CORRAL_IMAGES_DIR, default <CORRAL_DATA_DIR>/images]."""


def _image_store() -> ImageStore:
    from runtimes.images import ImageStore
    from runtimes.node.settings import NodeSettings

    try:
        settings = NodeSettings()
    except ValidationError as exc:
        raise click.UsageError("; ".join(e["msg"] for e in exc.errors())) from None
    return ImageStore(settings.resolved_images_dir)


def _progress() -> Progress:
    from runtimes.images import Progress

    return Progress(lambda line: click.echo(line, err=True))


def _image_line(image: Image) -> str:
    import datetime

    created = datetime.datetime.fromtimestamp(image.created).strftime("%Y-%m-%d %H:%M")
    size = f"{image.size_bytes / 1e6:.1f} MB"
    return f"{image.name or '<none>':<24} {image.short_digest:<12} {size:>10}  {created}"


@images.command("build")
@click.argument("name")
@click.option(
    "-f",
    "--file",
    "dockerfile",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A Dockerfile to build (FROM a local image); without it, NAME's built-in recipe.",
)
@click.option(
    "--context",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="The build context of COPY [the Dockerfile's directory].",
)
def images_build(name: str, dockerfile: Path | None, context: Path | None) -> None:
    """Build image NAME: from Debian's packages (a built-in recipe: python) or from a
    Dockerfile (-f) on top of a local image."""
    from runtimes.images import RECIPES, ImageError

    try:
        store = _image_store()
        if dockerfile is not None:
            from runtimes.images import dockerfile as df

            image = df.build(
                store,
                name,
                dockerfile,
                context=context or dockerfile.parent,
                progress=_progress(),
            )
        else:
            if context is not None:
                raise click.UsageError("--context needs -f Dockerfile")
            if name not in RECIPES:
                raise click.UsageError(
                    f"no built-in recipe {name!r} (there are: {', '.join(sorted(RECIPES))}); "
                    "give -f Dockerfile to build anything else"
                )
            from runtimes.images import debootstrap

            image = debootstrap.build(store, RECIPES[name], progress=_progress())
    except ImageError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{image.name} {image.digest}")


@images.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", required=True, help="The name to give the image.")
def images_import(file: Path, name: str) -> None:
    """Import FILE: an OCI image archive, a `docker save` tarball or a root filesystem
    tar (.tar, .tar.gz)."""
    from runtimes.images import ImageError, importer

    try:
        image = importer.import_file(_image_store(), file, name=name, progress=_progress())
    except ImageError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{image.name} {image.digest}")


@images.command("ls")
def images_ls() -> None:
    """List the images: name, digest (short), size, created."""
    from runtimes.images import ImageError

    try:
        found = _image_store().list()
    except ImageError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{'NAME':<24} {'DIGEST':<12} {'SIZE':>10}  CREATED")
    for image in found:
        click.echo(_image_line(image))


@images.command("rm")
@click.argument("ref")
def images_rm(ref: str) -> None:
    """Remove image REF: a name (the image goes with its last name) or a digest
    (sha256:..., a unique prefix will do; every name of it goes too)."""
    from runtimes.images import ImageError

    try:
        _image_store().remove(ref)
    except ImageError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"removed {ref}")


# --- sandboxes ----------------------------------------------------------------------------
#: ``ID:/path`` names a path in a sandbox (``ID:`` alone is its root); anything else is local
_REMOTE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_-]*):(.*)$")
#: the exit status of ``corral sandbox exec`` when the command has none (as timeout(1), sh)
EXIT_TIMED_OUT, EXIT_NOT_STARTED = 124, 126


@main.group()
def sandbox() -> None:
    """Stateful sandboxes (tenant): files and processes stay between commands."""


@contextmanager
def _sandboxes(url: str, api_key: str | None) -> Iterator[Corral]:
    """A client of the SDK whose errors end the command cleanly."""
    try:
        with Corral(url, api_key) as client:
            yield client
    except CorralError as exc:
        raise click.ClickException(str(exc) if exc.status else exc.message) from None


def _pairs(items: tuple[str, ...], hint: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=hint)
        pairs[name] = value
    return pairs


def _info_dict(info: SandboxInfo) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        json.dumps(dataclasses.asdict(info), default=lambda v: v.isoformat())
    )
    return data


def _remote(arg: str) -> tuple[str, str] | None:
    match = _REMOTE.match(arg)
    return (match[1], match[2] or "/") if match else None


@sandbox.command("create")
@click.option("--image", default="python", show_default=True, help="An image of the node.")
@click.option("--backend", default=None, help="crun (containers) [the server's default].")
@click.option("--cpu", type=float, default=None, help="Cores (a quota) [1].")
@click.option("--memory-mb", type=int, default=None, help="Memory limit, MiB [512].")
@click.option("--disk-mb", type=int, default=None, help="Size of the writable layer, MiB [1024].")
@click.option("--ttl", "ttl_s", type=float, default=None, help="Lifetime, s [300].")
@click.option("--idle-timeout", "idle_timeout_s", type=float, default=None, help="Idle limit, s.")
@click.option("--env", multiple=True, metavar="K=V", help="An environment variable (repeatable).")
@click.option("--meta", multiple=True, metavar="K=V", help="A metadata label (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole record as JSON.")
@_url
@_key
def sandbox_create(
    image: str,
    backend: str | None,
    cpu: float | None,
    memory_mb: int | None,
    disk_mb: int | None,
    ttl_s: float | None,
    idle_timeout_s: float | None,
    env: tuple[str, ...],
    meta: tuple[str, ...],
    as_json: bool,
    url: str,
    api_key: str | None,
) -> None:
    """Create a sandbox and print its id."""
    with _sandboxes(url, api_key) as client:
        sbx = client.sandboxes.create(
            image,
            backend=backend,
            cpu=cpu,
            memory_mb=memory_mb,
            disk_mb=disk_mb,
            ttl_s=ttl_s,
            idle_timeout_s=idle_timeout_s,
            env=_pairs(env, "--env"),
            metadata=_pairs(meta, "--meta"),
        )
    if as_json:
        _echo(_info_dict(sbx.info))
    else:
        click.echo(sbx.id)


def _write_out(data: str) -> None:
    sys.stdout.write(data)
    sys.stdout.flush()


def _write_err(data: str) -> None:
    sys.stderr.write(data)
    sys.stderr.flush()


@sandbox.command("exec")
@click.argument("sandbox_id")
@click.argument("cmd", nargs=-1, required=True)
@click.option("--env", multiple=True, metavar="K=V", help="An environment variable (repeatable).")
@click.option("--cwd", default=None, help="Working directory [the user's home].")
@click.option("--user", default=None, help="root, user, a uid or uid:gid [the sandbox's].")
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds.")
@click.option("--shell", is_flag=True, help="Run CMD as one /bin/sh -c line.")
@click.option(
    "--stdin", "stdin_file", type=click.File("r"), default=None, help="Input file ('-': ours)."
)
@_url
@_key
def sandbox_exec(
    sandbox_id: str,
    cmd: tuple[str, ...],
    env: tuple[str, ...],
    cwd: str | None,
    user: str | None,
    timeout: float,
    shell: bool,
    stdin_file: Any,
    url: str,
    api_key: str | None,
) -> None:
    """Run CMD in sandbox ID, its output streamed here as it comes; put CMD after --
    when it has options of its own: corral sandbox exec ID -- python3 -c 'print(1)'.

    Exits with the command's exit code; 128+N if signal N killed it, 124 if it timed out,
    126 if it could not start.
    """
    with _sandboxes(url, api_key) as client:
        sbx = client.sandboxes.get(sandbox_id)
        result = sbx.exec(
            " ".join(cmd) if shell else list(cmd),
            env=_pairs(env, "--env"),
            cwd=cwd,
            user=user,
            stdin=stdin_file.read() if stdin_file is not None else None,
            timeout_s=timeout,
            on_stdout=_write_out,
            on_stderr=_write_err,
        )
    if result.error:
        click.echo(f"[error: {result.error}]", err=True)
        sys.exit(EXIT_NOT_STARTED)
    if result.timed_out:
        click.echo(f"[timed out after {timeout:g} s]", err=True)
        sys.exit(EXIT_TIMED_OUT)
    if result.exit_code is None:
        sys.exit(128 + (result.signal or 0))
    sys.exit(result.exit_code)


@sandbox.command("cp")
@click.argument("src")
@click.argument("dst")
@_url
@_key
def sandbox_cp(src: str, dst: str, url: str, api_key: str | None) -> None:
    """Copy one file into or out of a sandbox: one side is ID:/path, the other a local
    path ('-': standard input or output). A directory ending in / takes the file's name."""
    source, target = _remote(src), _remote(dst)
    if (source is None) == (target is None):
        raise click.UsageError("one of SRC and DST is ID:/path, the other a local path")
    with _sandboxes(url, api_key) as client:
        if target is not None:
            _upload(client, src, *target)
        else:
            assert source is not None
            _download(client, *source, dst)


def _upload(client: Corral, local: str, sandbox_id: str, path: str) -> None:
    mode: int | None = None
    if local == "-":
        data = sys.stdin.buffer.read()
    else:
        file = Path(local)
        if file.is_dir():
            raise click.ClickException(
                f"{local} is a directory: cp copies one file (send a tar archive, then "
                f"`corral sandbox exec {sandbox_id} -- tar -xf ...`)"
            )
        try:
            data, mode = file.read_bytes(), stat.S_IMODE(file.stat().st_mode)
        except OSError as exc:
            raise click.ClickException(f"cannot read {local}: {exc.strerror}") from None
    files = client.sandboxes.get(sandbox_id).files
    if local != "-" and (path.endswith("/") or _is_dir(files, path)):
        path = posixpath.join(path, Path(local).name)
    files.write(path, data, mode=mode)


def _is_dir(files: Files, path: str) -> bool:
    try:
        return files.stat(path).is_dir
    except NotFound:
        return False


def _download(client: Corral, sandbox_id: str, path: str, local: str) -> None:
    files = client.sandboxes.get(sandbox_id).files
    if files.stat(path).is_dir:
        raise click.ClickException(f"{sandbox_id}:{path} is a directory: cp copies one file")
    data = files.read(path)
    if local == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    target = Path(local)
    if target.is_dir():
        target = target / posixpath.basename(path.rstrip("/"))
    try:
        target.write_bytes(data)
    except OSError as exc:
        raise click.ClickException(f"cannot write {target}: {exc.strerror}") from None


@sandbox.command("ls")
@click.argument("where", required=False)
@click.option("--state", default="live", show_default=True, help="live, or one state.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_url
@_key
def sandbox_ls(where: str | None, state: str, as_json: bool, url: str, api_key: str | None) -> None:
    """Without WHERE, the tenant's sandboxes; with ID:/path (or ID), that directory."""
    with _sandboxes(url, api_key) as client:
        if where is None:
            found = client.sandboxes.list(state)
            if as_json:
                _echo([_info_dict(s.info) for s in found])
                return
            click.echo(f"{'ID':<32} {'STATE':<9} {'IMAGE':<16} {'CREATED':<20} EXPIRES")
            for s in found:
                click.echo(
                    f"{s.id:<32} {s.state:<9} {s.info.image:<16} "
                    f"{_when(s.info.created_at):<20} {_when(s.info.expires_at)}"
                )
            return
        sandbox_id, path = _remote(where) or (where, "/")
        entries = client.sandboxes.get(sandbox_id).files.list(path)
    if as_json:
        _echo([dataclasses.asdict(e) for e in entries])
        return
    for e in entries:
        name = e.name + ("/" if e.is_dir else "")
        click.echo(
            f"{stat.filemode(_KINDS.get(e.type, 0) | e.mode)} {e.owner:>6} {e.size:>10} {name}"
        )


_KINDS = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "symlink": stat.S_IFLNK}


def _when(moment: datetime.datetime | None) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


@sandbox.command("rm")
@click.argument("sandbox_ids", nargs=-1, required=True, metavar="ID...")
@_url
@_key
def sandbox_rm(sandbox_ids: tuple[str, ...], url: str, api_key: str | None) -> None:
    """Destroy sandboxes (their files and processes); prints each id destroyed."""
    failed = 0
    with _sandboxes(url, api_key) as client:
        for sandbox_id in sandbox_ids:
            try:
                client.sandboxes.get(sandbox_id).kill()
            except (NotFound, Conflict) as exc:
                click.echo(f"Error: {sandbox_id}: {exc}", err=True)
                failed += 1
            else:
                click.echo(sandbox_id)
    if failed:
        sys.exit(1)


def _sandbox_action(name: str, summary: str) -> click.Command:
    @click.argument("sandbox_id")
    @_url
    @_key
    def command(sandbox_id: str, url: str, api_key: str | None) -> None:
        with _sandboxes(url, api_key) as client:
            sbx = client.sandboxes.get(sandbox_id)
            getattr(sbx, name)()
        click.echo(f"{sbx.id} {sbx.state}")

    command.__doc__ = summary
    return sandbox.command(name)(command)


sandbox_pause = _sandbox_action("pause", "Freeze every process of sandbox ID.")
sandbox_resume = _sandbox_action("resume", "Thaw paused sandbox ID.")
