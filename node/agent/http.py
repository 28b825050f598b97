"""A node's own HTTP listener (no API, no credentials).

* ``/healthz``: liveness: the node's work loops run. A Redis outage does not make a node
  unhealthy (restarting it would only hand its running executions out again).
* ``/readyz``: the loops run and Redis answers.
* ``/metrics``: Prometheus.
* ``/sandboxes/...``: the node's sandbox API (``node.sandboxes.http``), when the node
  has sandbox backends; it alone needs the node token.

A separate node listens on TCP (``node_host:node_port``); a node embedded in ``corral
serve`` that holds sandboxes listens on a Unix socket in its data dir (mode 0600). While
it serves, its app is also published in its own process (``node.agent.local``), so a
gateway in that process reaches it without the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from node.agent import local
from node.agent.agent import NodeAgent

log = logging.getLogger(__name__)


#: a kept-alive connection outlives the gateways' idle ones (``app.sandboxes.nodes``
#: expires them after 30 s): the client, not the server, closes an idle connection, so a
#: request is never sent on a connection the server is closing at that moment
KEEP_ALIVE_S = 75
_SERVER_OPTIONS: dict[str, Any] = {
    "log_level": "warning",
    "lifespan": "off",
    "timeout_keep_alive": KEEP_ALIVE_S,
}


def node_app(agent: NodeAgent, extra_routes: Sequence[BaseRoute] = ()) -> Starlette:
    def answer(ok: bool, **fields: object) -> Response:
        body = {
            "status": "ok" if ok else "unavailable",
            "node_id": agent.node_id,
            "incarnation": agent.incarnation,
            "working": agent.healthy,
            **fields,
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    async def healthz(request: Request) -> Response:
        return answer(agent.healthy)

    async def readyz(request: Request) -> Response:
        transport = await agent.transport.ready()
        return answer(agent.healthy and transport, transport=transport)

    async def metrics(request: Request) -> Response:
        return Response(agent.metrics.render(), media_type="text/plain; version=0.0.4")

    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            *extra_routes,
        ]
    )


class EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the process that embeds it (the
    node's listener here; the gateway's keyless listener in ``app.http.listeners``)."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        return contextlib.nullcontext()


@contextlib.asynccontextmanager
async def serving(
    agent: NodeAgent,
    host: str,
    port: int,
    *,
    uds: Path | None = None,
    extra_routes: Sequence[BaseRoute] = (),
) -> AsyncIterator[str]:
    """Serve the node's endpoints while the block runs; yields the address (``host:port``,
    or ``unix:PATH`` when ``uds`` is given)."""
    app = node_app(agent, extra_routes)
    if uds is not None:
        uds.unlink(missing_ok=True)  # noqa: ASYNC240 - a stale socket, once
        config = uvicorn.Config(app, uds=str(uds), **_SERVER_OPTIONS)
    else:
        config = uvicorn.Config(app, host=host, port=port, **_SERVER_OPTIONS)
    server = EmbeddedServer(config)
    task = asyncio.create_task(server.serve(), name="node-http")
    try:
        while not server.started:
            if task.done():
                await task  # raises what stopped it
                raise RuntimeError(f"the node's HTTP listener on {uds or port} did not start")
            await asyncio.sleep(0.01)
        if uds is not None:
            os.chmod(uds, 0o600)
            address = f"unix:{uds}"
        else:
            bound = server.servers[0].sockets[0].getsockname()
            address = f"{bound[0]}:{bound[1]}"
        log.info("node %s: listening on %s", agent.node_id, address)
        with local.published(address, app):
            yield address
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if uds is not None:
            uds.unlink(missing_ok=True)  # noqa: ASYNC240
