"""A node's own HTTP listener (no API, no credentials).

* ``/healthz``: liveness: the node's work loops run. A Redis outage does not make a node
  unhealthy (restarting it would only hand its running executions out again).
* ``/readyz``: the loops run and Redis answers.
* ``/metrics``: Prometheus.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runtimes.node.agent import NodeAgent

log = logging.getLogger(__name__)


def node_app(agent: NodeAgent) -> Starlette:
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
        routes=[Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics)]
    )


class EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the process that embeds it (the
    node's listener here; the gateway's keyless listener in ``app.http.listeners``)."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        return contextlib.nullcontext()


@contextlib.asynccontextmanager
async def serving(agent: NodeAgent, host: str, port: int) -> AsyncIterator[str]:
    """Serve the node's endpoints while the block runs; yields the address (``host:port``)."""
    server = EmbeddedServer(
        uvicorn.Config(node_app(agent), host=host, port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve(), name="node-http")
    try:
        while not server.started:
            if task.done():
                await task  # raises what stopped it
                raise RuntimeError(f"the node's HTTP listener on {host}:{port} did not start")
            await asyncio.sleep(0.01)
        bound = server.servers[0].sockets[0].getsockname()
        address = f"{bound[0]}:{bound[1]}"
        log.info("node %s: /healthz, /readyz and /metrics on http://%s", agent.node_id, address)
        yield address
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
