"""Running a node: its backends, its agent and its HTTP listener, released on exit.

``running_node`` is shared by ``corral node`` (a separate node on Redis, ``run_node``)
and ``corral serve`` (a node embedded beside the gateway, on the in-process transport).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable, Sequence

from starlette.routing import BaseRoute

from common.redis import connect
from node.agent.agent import NodeAgent
from node.agent.http import serving
from node.agent.limits import raise_open_files_limit
from node.agent.metrics import NodeMetrics
from node.agent.redis import RedisNodeTransport
from node.agent.transport import NodeTransport
from node.artifacts import Artifacts, Source, http_source
from node.fncall import registry
from node.fncall.base import FnBackend
from node.sandboxes.base import RootImage
from node.sandboxes.http import sandbox_routes
from node.sandboxes.service import build_manager
from node.sandboxes.transfers import TransferSlots
from node.sandboxes.watch import WatchLimits
from node.settings import NodeSettings

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def running_node(
    settings: NodeSettings,
    transport: NodeTransport,
    *,
    metrics: NodeMetrics | None = None,
    serve_http: bool = True,
    resolve_image: Callable[[str], RootImage] | None = None,
    fetch_artifact: Source | None = None,
) -> AsyncIterator[NodeAgent]:
    """A node agent with its backends started; on exit it drains and releases them.

    Function artifacts a Job names by digest come from ``fetch_artifact`` (the embedded
    node: the gateway's record), else from the control plane at ``control_url``.

    With sandbox backends, the node's sandbox API is served too: on TCP beside
    ``/healthz`` (``serve_http``), else on a Unix socket in the data dir (embedded)."""
    raise_open_files_limit()
    backends: dict[str, FnBackend] = {}
    try:
        for name in settings.runtimes:
            backends[name] = registry.create(name, settings)
    except BaseException:
        for backend in backends.values():
            await backend.close()
        raise
    if fetch_artifact is None:
        token = settings.node_token.get_secret_value() if settings.node_token else ""
        fetch_artifact = http_source(settings.control_urls, token)
    artifacts = Artifacts(fetch_artifact)
    for backend in backends.values():
        backend.artifacts = artifacts
    agent = NodeAgent(
        settings, transport, backends, metrics=metrics, usage_period_s=settings.usage_report_seconds
    )
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(agent.close)  # also releases backends after a failed start
        routes: Sequence[BaseRoute] = ()
        if settings.sandbox_backends:
            if settings.node_token is None:
                raise ValueError("a node with sandbox backends needs CORRAL_NODE_TOKEN")
            sandboxes = build_manager(settings, resolve_image=resolve_image)
            stack.push_async_callback(sandboxes.close)
            await sandboxes.start()
            agent.sandboxes = sandboxes
            token = settings.node_token.get_secret_value()
            transfers = TransferSlots(
                per_tenant=settings.sandbox_transfers_per_tenant,
                per_node=settings.sandbox_transfers_per_node,
            )
            limits = WatchLimits(
                per_tenant=settings.sandbox_max_watchers_per_tenant,
                per_node=settings.sandbox_max_watchers,
            )
            routes = sandbox_routes(
                sandboxes,
                token,
                node_id=agent.node_id,
                transfers=transfers,
                watch_limits=limits,
            )
        if serve_http and settings.node_port is not None:
            agent.address = await stack.enter_async_context(
                serving(agent, settings.node_host, settings.node_port, extra_routes=routes)
            )
        elif routes:
            uds = settings.data_dir.resolve() / "node.sock"
            agent.address = await stack.enter_async_context(
                serving(agent, "", 0, uds=uds, extra_routes=routes)
            )
        await agent.start()
        yield agent


async def run_node(settings: NodeSettings) -> None:
    """``corral node``: serve until SIGTERM or SIGINT, then drain."""
    if not settings.redis_url:
        raise ValueError("a separate node needs CORRAL_REDIS_URL to reach the gateways")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    redis = connect(settings.redis_url)
    try:
        transport = RedisNodeTransport(redis, dead_after_s=settings.node_dead_after_seconds)
        async with running_node(settings, transport):
            await stop.wait()
            log.info("node %s: stopping", settings.resolved_node_id)
    finally:
        await redis.aclose()
