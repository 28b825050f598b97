"""Everything a gateway process holds, built and released by the app lifespan.

``open_services`` enters each resource on an ``AsyncExitStack``, so whatever was opened
is closed again, in reverse order, however start-up or shutdown ends: an embedded node
drains first, then the recorder stores what it drained, then the writer commits what is
queued, then connections close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic import SecretStr
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from app.api.e2b.tokens import SandboxTokens, load_secret
from app.auth.authenticator import Authenticator
from app.auth.cache import KeyCache
from app.auth.key_use import KeyUse
from app.auth.revocations import LocalRevocations, RedisRevocations, Revocations
from app.db import files, tenants
from app.db import functions as functions_repo
from app.db.engine import make_engine, make_sessionmaker
from app.db.migrate import upgrade
from app.db.transactions import transactions_for
from app.db.writer import BatchWriter
from app.dispatch.inprocess import InProcessTransport
from app.dispatch.redis import RedisGatewayTransport
from app.dispatch.transport import GatewayTransport
from app.errors import Conflict
from app.failpoints import Failpoints
from app.functions.artifacts import ArtifactCache
from app.functions.resolver import Resolver
from app.functions.schema import Validators
from app.images.build import Builds
from app.images.catalog import ControlImages
from app.invocations.leader import election_for
from app.invocations.reconciler import Policy, Reconciler
from app.invocations.recorder import Recorder
from app.invocations.retention import Retention
from app.invocations.service import Invocations, Timing
from app.invocations.waiters import Waiters
from app.leader import Leader, gateway_jobs
from app.metrics import Metrics
from app.placement.best_of_k import BestOfK
from app.placement.catalogue import Catalogue
from app.quotas.admission import Admission
from app.quotas.counters import MemoryCounters, QuotaCounters
from app.quotas.readings import Readings
from app.quotas.redis_counters import RedisCounters
from app.quotas.spec import OLD_PACING, PACING
from app.quotas.throttles import Throttles
from app.sandboxes.admission import SandboxAdmission
from app.sandboxes.service import Sandboxes
from app.settings import Settings
from common.redis import connect
from node.agent.agent import NodeAgent
from node.agent.main import running_node
from node.agent.metrics import NodeMetrics
from node.agent.redis import RedisNodeTransport
from node.agent.transport import NodeTransport

log = logging.getLogger(__name__)

#: How long, at shutdown, the recorder may take to store what it still holds.
_DRAIN_TIMEOUT_S = 15.0


@dataclass
class Services:
    settings: Settings
    metrics: Metrics
    engine: AsyncEngine
    sessions: async_sessionmaker[Any]
    writer: BatchWriter
    transport: GatewayTransport
    counters: QuotaCounters
    admission: Admission
    authenticator: Authenticator
    invocations: Invocations
    catalogue: Catalogue
    recorder: Recorder
    reconciler: Reconciler
    leader: Leader  #: the named jobs one gateway runs (``app.leader``)
    sandboxes: Sandboxes
    images: ControlImages
    builds: Builds  #: tenants' images built through the API (``app.images.build``)
    resolver: Resolver  #: function rows and versions by name and number
    sandbox_tokens: SandboxTokens  #: E2B's sandbox access tokens
    redis: Redis | None = None
    node: NodeAgent | None = None
    #: Per-process caches of the tool-function path (with ``resolver``): artifacts by
    #: (tenant, hash), and compiled input-schema validators by (immutable) function version.
    artifacts: ArtifactCache = field(default_factory=ArtifactCache)
    validators: Validators = field(default_factory=Validators)
    gauges: dict[str, dict[str, float]] = field(default_factory=dict)

    async def read_artifact(self, tenant_id: str, digest: str) -> bytes:
        """A function artifact from this gateway's record: the embedded node's source of
        what a Job names by digest (a separate node fetches it over HTTP)."""
        data = self.artifacts.get(tenant_id, digest)
        if data is None:
            async with self.sessions() as session:
                data = await functions_repo.artifact(
                    session, tenant_id=tenant_id, content_hash=digest
                )
            self.artifacts.put(tenant_id, digest, data)
        return data

    async def refresh_gauges(self) -> None:
        """Read the asynchronous gauges (queue depth) before a scrape."""
        nodes = await self.catalogue.nodes()
        runtimes = sorted({rt for node in nodes for rt in node.runtimes})
        backlog = await self.transport.backlog(runtimes) if runtimes else {}
        self.gauges["queue"] = {
            "dispatch": float(sum(backlog.values())),
            "admission": float(await self.counters.waiting()),
        }


@contextlib.asynccontextmanager
async def open_services(
    settings: Settings, *, metrics: Metrics, with_node: bool
) -> AsyncIterator[Services]:
    async with contextlib.AsyncExitStack() as stack:
        files.prepare(settings.data_dir, settings.resolved_database_url)
        engine = make_engine(settings.resolved_database_url)
        stack.push_async_callback(engine.dispose)
        if settings.run_migrations:
            await upgrade(engine)
        sessions = make_sessionmaker(engine)
        transactions = transactions_for(settings.resolved_database_url, sessions)
        writer = BatchWriter(transactions)
        await writer.start()
        stack.push_async_callback(writer.close)

        redis: Redis | None = None
        transport: GatewayTransport
        node_transport: NodeTransport
        counters: QuotaCounters
        if settings.redis_url:
            redis = connect(settings.redis_url)
            stack.push_async_callback(redis.aclose)
            transport = RedisGatewayTransport(redis, dead_after_s=settings.node_dead_after_seconds)
            node_transport = RedisNodeTransport(
                redis, dead_after_s=settings.node_dead_after_seconds
            )
            counters = RedisCounters(redis)
            revocations: Revocations = RedisRevocations(
                redis, every_s=settings.auth_revocation_check_seconds
            )
        else:
            in_process = InProcessTransport(dead_after_s=settings.node_dead_after_seconds)
            transport = node_transport = in_process
            counters = MemoryCounters()
            revocations = LocalRevocations()
        await transport.start()
        stack.push_async_callback(transport.close)
        stack.push_async_callback(counters.close)

        failpoints = Failpoints(settings.failpoints if settings.dev_mode else {})
        waiters = Waiters()
        stack.callback(waiters.close)
        readings = Readings(sessions)
        throttles = Throttles(metrics, counters)
        admission = Admission(
            counters,
            readings,
            queue_seconds=settings.admission_queue_seconds,
            queue_depth=settings.admission_queue_depth,
            throttles=throttles,
        )
        catalogue = Catalogue(transport, refresh_s=settings.catalogue_seconds)
        placement = BestOfK(
            catalogue, k=settings.placement_choices, max_queued=settings.max_queued_per_runtime
        )
        timing = Timing(
            wait_grace_s=settings.result_wait_grace_seconds,
            hold_s=settings.hold_seconds,
            queue_s=settings.queue_seconds,
            record_retry_s=settings.record_retry_seconds,
        )
        recorder = Recorder(
            transport=transport,
            writer=writer,
            waiters=waiters,
            metrics=metrics,
            failpoints=failpoints,
            tries=settings.record_tries,
        )
        reconciler = Reconciler(
            sessions=sessions,
            writer=writer,
            transport=transport,
            recorder=recorder,
            metrics=metrics,
            policy=Policy(
                grace_s=settings.reconcile_grace_seconds,
                stuck_grace_s=settings.stuck_grace_seconds,
                max_attempts=settings.max_attempts,
                timing=timing,
            ),
        )
        invocations = Invocations(
            sessions=sessions,
            writer=writer,
            transport=transport,
            placement=placement,
            admission=admission,
            waiters=waiters,
            metrics=metrics,
            timing=timing,
            failpoints=failpoints,
        )
        stack.push_async_callback(invocations.close)
        if with_node and settings.node.sandbox_backends and settings.node.node_token is None:
            # the embedded node and this gateway share a token made for this process
            settings.node.node_token = SecretStr(secrets.token_urlsafe(32))
        token = settings.node.node_token
        images = ControlImages(settings.resolved_images_dir)
        sandboxes = Sandboxes(
            sessions=sessions,
            catalogue=catalogue,
            node_token=token.get_secret_value() if token is not None else None,
            images=images,
            rows=transactions,
            admission=SandboxAdmission(counters, readings, throttles=throttles),
            meter_every_s=settings.sandbox_meter_seconds,
        )
        stack.push_async_callback(sandboxes.close)
        builds = Builds(sandboxes=sandboxes, images=images, owned=sandboxes.owned)
        stack.push_async_callback(builds.close)
        election = election_for(engine)
        stack.push_async_callback(election.close)
        leader = Leader(
            election=election,
            jobs=gateway_jobs(
                reconciler=reconciler,
                sessions=sessions,
                retention=Retention(
                    blobs=timedelta(hours=settings.blob_retention_hours),
                    invocations=timedelta(days=settings.invocation_retention_days),
                    usage_events=timedelta(days=settings.usage_event_retention_days),
                ),
                sandbox_sync=sandboxes.sync,
                settings=settings,
            ),
            metrics=metrics,
            check_every_s=settings.reconcile_seconds,
        )
        key_use = KeyUse(sessions)
        services = Services(
            settings=settings,
            metrics=metrics,
            engine=engine,
            sessions=sessions,
            writer=writer,
            transport=transport,
            counters=counters,
            admission=admission,
            authenticator=Authenticator(
                sessions,
                admin_key=settings.admin_key.get_secret_value() if settings.admin_key else None,
                cache=KeyCache(ttl_s=settings.auth_cache_seconds, size=settings.auth_cache_size),
                default_quota=settings.quota.limits(),
                default_tenant=settings.default_tenant,
                revocations=revocations,
                key_use=key_use,
            ),
            invocations=invocations,
            catalogue=catalogue,
            recorder=recorder,
            reconciler=reconciler,
            leader=leader,
            sandboxes=sandboxes,
            images=images,
            builds=builds,
            resolver=Resolver(sessions, ttl_s=settings.function_cache_seconds),
            sandbox_tokens=_sandbox_tokens(settings),
            redis=redis,
        )
        stack.callback(services.validators.close)
        _register_gauges(services)

        _keep(stack, recorder.run, "corral-recorder", finally_=_drain(recorder, transport))
        _keep(
            stack,
            lambda: _keep_alive(transport, settings.heartbeat_seconds),
            "corral-gateway-alive",
        )
        _keep(stack, leader.run, "corral-leader")
        _keep(stack, key_use.run, "corral-key-use", finally_=_last_flush(key_use))
        if settings.default_tenant:
            await ensure_tenant(sessions, settings.default_tenant, settings)
        if with_node:
            node_metrics = NodeMetrics()
            metrics.include(node_metrics.registry)
            services.node = await stack.enter_async_context(
                running_node(
                    settings.node,
                    node_transport,
                    metrics=node_metrics,
                    serve_http=False,
                    fetch_artifact=services.read_artifact,
                )
            )
        # before the embedded node stops: teardowns of destroys acknowledged already
        stack.push_async_callback(sandboxes.drain)
        yield services


def _sandbox_tokens(settings: Settings) -> SandboxTokens:
    configured = settings.sandbox_token_secret
    if configured is None and settings.redis_url and settings.node.node_token is not None:
        # a cluster's gateway that reaches sandbox nodes (it holds their token)
        log.warning(
            "CORRAL_SANDBOX_TOKEN_SECRET is not set: sandbox access tokens are signed with "
            "this gateway's own secret (%s), which other gateways reject unless they share "
            "that data dir",
            settings.data_dir / "sandbox-token-secret",
        )
    secret = load_secret(
        configured.get_secret_value() if configured is not None else None, settings.data_dir
    )
    return SandboxTokens(secret)


def _keep(
    stack: contextlib.AsyncExitStack,
    loop: Callable[[], Coroutine[Any, Any, None]],
    name: str,
    *,
    finally_: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Run ``loop`` as a task until the stack unwinds; then cancel it (and run ``finally_``)."""
    task = asyncio.create_task(loop(), name=name)

    async def stop() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if finally_ is not None:
            await finally_()

    stack.push_async_callback(stop)


def _drain(recorder: Recorder, transport: GatewayTransport) -> Callable[[], Awaitable[None]]:
    async def drain() -> None:
        entries = transport.drain()
        if entries:
            try:
                await asyncio.wait_for(recorder.record(entries), _DRAIN_TIMEOUT_S)
            except TimeoutError:
                log.error("recorder: %d results not stored at shutdown", len(entries))

    return drain


def _last_flush(key_use: KeyUse) -> Callable[[], Awaitable[None]]:
    async def flush() -> None:
        try:
            await key_use.flush()
        except Exception as exc:  # the database may be gone first: the use is only late
            log.warning("api keys' last use not stored at shutdown: %r", exc)

    return flush


async def _keep_alive(transport: GatewayTransport, period_s: float) -> None:
    while True:
        try:
            await transport.keep_alive()
        except Exception as exc:
            log.warning("gateway %s: keep-alive failed: %r", transport.gateway_id, exc)
        await asyncio.sleep(period_s)


def _register_gauges(services: Services) -> None:
    writer = services.writer
    services.metrics.gauge(
        "corral_db_writer",
        "Group-commit writer: writes, batches (transactions), seconds spent committing; on a"
        " SQLite file, commits made on the event loop and lone writes that found the lock held.",
        writer.counters,
        "counter",
    )
    services.metrics.gauge(
        "corral_queue_depth",
        "Work waiting: in dispatch (overflow streams), or in admission queues.",
        lambda: services.gauges.get("queue", {}),
        "queue",
    )
    services.metrics.gauge(
        "corral_reconciler_leading",
        "1 when this gateway leads (runs the leader's jobs: app/leader.py).",
        lambda: {"leading": float(services.leader.leading)},
        "state",
    )


async def ensure_tenant(sessions: async_sessionmaker[Any], name: str, settings: Settings) -> None:
    """Create the keyless tenant ``name`` unless it exists, with the defaults but no pacing
    quota the operator did not set (``QuotaDefaults.keyless_limits``: one box's keyless
    clients are limited by the machine, not by a rate). One made by an older version, still
    holding exactly the old pacing defaults (200 calls/s), is lifted the same way."""
    keyless = settings.quota.keyless_limits()
    pacing = {field: getattr(keyless, field) for field in PACING}
    async with sessions.begin() as session:
        found = await tenants.find_tenant_by_name(session, name=name)
        if found is not None:
            stored = found.quota.limits
            if all(stored.get(k) == v for k, v in OLD_PACING.items()):
                await tenants.update_tenant(session, tenant_id=found.id, quota=pacing)
                log.info("default tenant %s: the old pacing quotas lifted (%s)", name, pacing)
            return
        try:
            tenant, _key, _plaintext = await tenants.create_tenant(
                session, name=name, quota=keyless
            )
        except Conflict:  # another process made it first
            return
    log.info("default tenant %s (%s) created for keyless requests", name, tenant.id)
