"""Everything a running Corral process holds, built and released by the app lifespan.

``open_services`` enters each resource on an ``AsyncExitStack``, so whatever was
opened is closed again, in reverse order, however start-up or shutdown ends.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from app.db import tenants
from app.db.engine import make_engine, make_sessionmaker
from app.db.migrate import upgrade
from app.db.writer import BatchWriter
from app.dispatch.base import Dispatcher
from app.dispatch.inprocess import InProcessDispatcher
from app.dispatch.redis_streams import RedisStreamsDispatcher
from app.errors import Conflict
from app.execution import Executor
from app.functions.artifacts import ArtifactCache
from app.functions.schema import Validators
from app.http.auth import Authenticator
from app.metrics import Metrics
from app.quotas.admission import Admission
from app.quotas.counters import MemoryCounters, QuotaCounters
from app.quotas.cpu import CpuUsage
from app.quotas.model import QuotaLimits
from app.quotas.redis_counters import RedisCounters
from app.settings import Settings
from runtimes import registry
from runtimes.node import NodeAgent

log = logging.getLogger(__name__)


@dataclass
class Services:
    settings: Settings
    metrics: Metrics
    engine: AsyncEngine
    sessions: async_sessionmaker[Any]
    dispatcher: Dispatcher
    counters: QuotaCounters
    admission: Admission
    authenticator: Authenticator
    writer: BatchWriter
    executor: Executor
    redis: Redis | None = None
    node: NodeAgent | None = None
    #: Per-process caches of the tool-function path: artifacts by (tenant, hash), and
    #: compiled input-schema validators by (immutable) function version.
    artifacts: ArtifactCache = field(default_factory=ArtifactCache)
    validators: Validators = field(default_factory=Validators)
    gauges: dict[str, dict[str, float]] = field(default_factory=dict)

    async def refresh_gauges(self) -> None:
        """Read the asynchronous gauges (queue depth) before a scrape."""
        self.gauges["queue"] = {
            "dispatch": float(await self.dispatcher.queue_depth()),
            "admission": float(await self.counters.waiting()),
        }


@contextlib.asynccontextmanager
async def open_services(
    settings: Settings, *, metrics: Metrics, with_node: bool
) -> AsyncIterator[Services]:
    async with contextlib.AsyncExitStack() as stack:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        engine = make_engine(settings.resolved_database_url)
        stack.push_async_callback(engine.dispose)
        if settings.run_migrations:
            await upgrade(engine)
        sessions = make_sessionmaker(engine)
        writer = BatchWriter(sessions)
        await writer.start()
        stack.push_async_callback(writer.close)

        redis: Redis | None = None
        dispatcher: Dispatcher
        counters: QuotaCounters
        if settings.redis_url:
            redis = Redis.from_url(settings.redis_url, decode_responses=True)
            stack.push_async_callback(redis.aclose)
            dispatcher = RedisStreamsDispatcher(
                redis,
                runtimes=registry.names(),
                node_dead_after_s=settings.node_dead_after_seconds,
            )
            counters = RedisCounters(redis)
        else:
            dispatcher = InProcessDispatcher()
            counters = MemoryCounters()
        await dispatcher.start()
        stack.push_async_callback(dispatcher.close)
        stack.push_async_callback(counters.close)

        admission = Admission(
            counters,
            CpuUsage(sessions),
            queue_seconds=settings.admission_queue_seconds,
            queue_depth=settings.admission_queue_depth,
        )
        services = Services(
            settings=settings,
            metrics=metrics,
            engine=engine,
            sessions=sessions,
            dispatcher=dispatcher,
            counters=counters,
            admission=admission,
            authenticator=Authenticator(
                sessions,
                admin_key=settings.admin_key.get_secret_value() if settings.admin_key else None,
                cache_seconds=settings.auth_cache_seconds,
                default_tenant=settings.default_tenant,
                default_loopback_only=settings.default_tenant_loopback_only,
            ),
            writer=writer,
            executor=Executor(
                sessions=sessions,
                writer=writer,
                dispatcher=dispatcher,
                admission=admission,
                metrics=metrics,
                wait_grace_s=settings.result_wait_grace_seconds,
            ),
            redis=redis,
        )
        metrics.gauge(
            "corral_db_writer",
            "Group-commit writer: writes, batches (transactions) and seconds spent committing.",
            lambda: {
                "writes": float(writer.writes),
                "batches": float(writer.batches),
                "commit_seconds": writer.commit_seconds,
            },
            "counter",
        )
        metrics.gauge(
            "corral_queue_depth",
            "Work waiting: in dispatch, or in admission queues.",
            lambda: services.gauges.get("queue", {}),
            "queue",
        )
        if settings.default_tenant:
            await ensure_tenant(sessions, settings.default_tenant, settings)
        if with_node:
            services.node = await stack.enter_async_context(
                running_node(settings, dispatcher, sessions, writer, metrics)
            )
        yield services


async def ensure_tenant(sessions: async_sessionmaker[Any], name: str, settings: Settings) -> None:
    """Create tenant ``name`` with the default quotas unless it exists."""
    async with sessions.begin() as session:
        if await tenants.find_tenant_by_name(session, name=name) is not None:
            return
        try:
            tenant, _key, _plaintext = await tenants.create_tenant(
                session, name=name, quota=QuotaLimits.from_defaults(settings.quota)
            )
        except Conflict:  # another process made it first
            return
    log.info("default tenant %s (%s) created for keyless requests", name, tenant.id)


@contextlib.asynccontextmanager
async def running_node(
    settings: Settings,
    dispatcher: Dispatcher,
    sessions: async_sessionmaker[Any],
    writer: BatchWriter,
    metrics: Metrics,
) -> AsyncIterator[NodeAgent]:
    """A node agent with its runtimes started; closed (drained) on exit."""
    runtimes = {}
    agent: NodeAgent | None = None
    try:
        for name in settings.runtimes:
            runtimes[name] = registry.create(name, settings)
        agent = NodeAgent(
            settings,
            dispatcher,
            sessions,
            writer,
            runtimes,
            on_result=lambda rt, status: metrics.node_executions.labels(rt, status).inc(),
        )
        metrics.gauge(
            "corral_pool_workers",
            "Warm-pool workers on this node by runtime and state.",
            lambda: {
                f"{rt}:{state}": float(n)
                for rt, counts in agent.stats().items()
                for state, n in counts.items()
            },
            "pool",
        )
        await agent.start()
        yield agent
    finally:
        if agent is not None:
            await agent.close()
        else:
            for runtime in runtimes.values():
                await runtime.close()
