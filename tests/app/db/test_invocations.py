"""The invocation record under claim tokens: only the current hand-out can store a result,
a final row is never written again, a re-run always shows in ``attempts``, and each final
row appends exactly one usage event (rolled up exactly once). SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import async_sessionmaker

from app.db import blobs, tenants, usage
from app.db import invocations as inv
from app.db.engine import make_engine, make_sessionmaker
from app.db.migrate import upgrade
from app.db.models import Blob, Invocation, UsageEvent, UsageRollup
from app.db.outputs import INLINE_BYTES, PREVIEW_CHARS
from app.db.transactions import transactions_for
from app.db.writer import BatchWriter
from app.invocations.retention import Retention, sweep
from app.quotas.spec import QuotaLimits
from app.settings import Settings
from wire.execution import RunResult, StageResult, StageStatus
from wire.messages import PoolUsage


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database (a sync fixture: ``postgres_url`` runs its own event loop)."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path}/i.db"
    raw = request.getfixturevalue("postgres_url")
    return Settings(dev_mode=True, database_url=raw).resolved_database_url


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[async_sessionmaker[Any]]:
    engine = make_engine(database_url)
    await upgrade(engine)
    try:
        yield make_sessionmaker(engine)
    finally:
        await engine.dispose()


@pytest.fixture
async def writer(
    database_url: str, sessions: async_sessionmaker[Any]
) -> AsyncIterator[BatchWriter]:
    """As the app commits: in the writer's thread on SQLite, in sessions on PostgreSQL."""
    w = BatchWriter(transactions_for(database_url, sessions))
    await w.start()
    try:
        yield w
    finally:
        await w.close()


@pytest.fixture
async def tenant_id(sessions: async_sessionmaker[Any]) -> str:
    async with sessions.begin() as session:
        tenant, _key, _plain = await tenants.create_tenant(session, name="t", quota=QuotaLimits())
    return tenant.id


NOW = datetime.now(UTC)


def create(
    tenant_id: str, n: int = 1, claim: str = "c1", request: dict[str, Any] | None = None
) -> inv.Create:
    return inv.Create(
        invocation_id=f"inv_{n}",
        tenant_id=tenant_id,
        kind="run",
        runtime="fake",
        language="fake",
        request=request or {},
        claim=claim,
        job='{"placeholder": true}',
    )


def finish(n: int = 1, claim: str = "c1", stdout: str = "out", attempt: int = 1) -> inv.Finish:
    result = RunResult(
        run=StageResult(status=StageStatus.FINISHED, exit_code=0, stdout=stdout, cpu_ms=7.0),
        cpu_ms=7.0,
        exec_ms=3.0,
    )
    return inv.Finish(
        invocation_id=f"inv_{n}",
        claim=claim,
        attempt=attempt,
        node_id=f"node-{claim}",
        started_at=NOW,
        finished_at=NOW,
        queue_ms=1.0,
        result=result,
    )


async def row(sessions: async_sessionmaker[Any], n: int = 1) -> Invocation:
    async with sessions() as session:
        found = await session.get(Invocation, f"inv_{n}")
        assert found is not None
        return found


async def events(sessions: async_sessionmaker[Any]) -> list[UsageEvent]:
    async with sessions() as session:
        return list((await session.scalars(select(UsageEvent).order_by(UsageEvent.id))).all())


async def test_create_keeps_the_dispatch_intent_until_the_row_is_final(
    writer: BatchWriter, sessions: async_sessionmaker[Any], tenant_id: str
) -> None:
    created = await writer.write(create(tenant_id))
    assert (created.status, created.attempts, created.claim) == ("queued", 1, "c1")
    assert (await row(sessions)).job == '{"placeholder": true}'
    stored = await writer.write(finish())
    assert stored is not None and stored["status"] == "succeeded" and stored["job"] is None
    final = await row(sessions)
    assert (final.status, final.job, final.stdout, final.attempts) == ("succeeded", None, "out", 1)


async def test_only_the_current_claim_stores_and_only_once(
    writer: BatchWriter, sessions: async_sessionmaker[Any], tenant_id: str
) -> None:
    await writer.write(create(tenant_id))
    assert await writer.write(inv.MarkRunning("inv_1", "c1", node_id="a", started_at=NOW))
    assert not await writer.write(inv.MarkRunning("inv_1", "forged", node_id="x", started_at=NOW))
    assert await writer.write(finish(claim="forged")) is None
    assert await writer.write(finish(stdout="first")) is not None
    assert await writer.write(finish(stdout="second")) is None  # a final row is never rewritten
    assert not await writer.write(inv.Reissue("inv_1", "c1", new_claim="c2"))
    assert await writer.write(inv.Fail("inv_1", "c1", error="lost: x")) is None
    final = await row(sessions)
    assert (final.status, final.stdout, final.node_id) == ("succeeded", "first", "node-c1")
    assert [e.subject_id for e in await events(sessions)] == ["inv_1"]


async def test_a_reissued_execution_shows_its_attempts_and_fences_the_old_claim(
    writer: BatchWriter, sessions: async_sessionmaker[Any], tenant_id: str
) -> None:
    """The node presumed dead finishes first: its result is refused, the re-run's stands,
    and attempts says it ran twice."""
    await writer.write(create(tenant_id))
    await writer.write(inv.MarkRunning("inv_1", "c1", node_id="a", started_at=NOW))
    assert await writer.write(inv.Reissue("inv_1", "c1", new_claim="c2"))
    reissued = await row(sessions)
    assert (reissued.status, reissued.claim, reissued.attempts) == ("queued", "c2", 2)
    assert reissued.node_id is None and reissued.job is not None
    assert await writer.write(finish(claim="c1", stdout="stale")) is None
    stored = await writer.write(finish(claim="c2", stdout="rerun", attempt=2))
    assert stored is not None and stored["attempts"] == 2
    final = await row(sessions)
    assert (final.stdout, final.attempts, final.node_id) == ("rerun", 2, "node-c2")


async def test_a_batch_of_mixed_writes_keeps_lifecycle_order_and_fencing(
    writer: BatchWriter, sessions: async_sessionmaker[Any], tenant_id: str
) -> None:
    """Written together (one transaction): finishes queued before their rows still land,
    the first current finish per row wins, stale claims lose."""
    outcomes = await asyncio.gather(
        writer.write(finish(1, stdout="first")),
        writer.write(create(tenant_id, 1)),
        writer.write(create(tenant_id, 2)),
        writer.write(inv.MarkRunning("inv_2", "c1", node_id="a", started_at=NOW)),
        writer.write(finish(1, stdout="second")),
        writer.write(finish(2, claim="old")),
        writer.write(inv.Fail("inv_2", "c1", error="lost: test")),
    )
    assert outcomes[0] is not None and outcomes[4] is None and outcomes[5] is None
    assert outcomes[3] is True and outcomes[6] is not None
    assert (await row(sessions, 1)).stdout == "first"
    failed = await row(sessions, 2)
    assert (failed.status, failed.error) == ("errored", "lost: test")
    assert sorted(e.subject_id for e in await events(sessions)) == ["inv_1", "inv_2"]


async def test_usage_events_are_copied_from_the_stored_row_and_rolled_up_once(
    writer: BatchWriter, sessions: async_sessionmaker[Any], tenant_id: str
) -> None:
    await writer.write(create(tenant_id))
    await writer.write(finish())
    pool = PoolUsage(
        node_id="n1",
        pool="wasm/wasm-python",
        period_start=0.0,
        period_end=NOW.timestamp(),
        idle_instance_seconds=120.0,
        idle_memory_mb_seconds=1200.0,
        starts=3,
        start_cpu_ms=90.0,
    )
    async with sessions.begin() as session:
        await usage.record_pool_usage(session, [pool])
    async with sessions.begin() as session:
        await usage.record_pool_usage(session, [pool])  # read twice: stored once
    stored = await events(sessions)
    assert [(e.subject, e.tenant_id, e.status) for e in stored] == [
        ("invocation", tenant_id, "succeeded"),
        ("pool", None, None),
    ]
    assert stored[0].cpu_ms == 7.0 and stored[0].exec_ms == 3.0 and stored[0].node_id == "node-c1"
    # the call held its instance from its setup to its teardown
    held_ms = stored[0].setup_ms + stored[0].exec_ms + stored[0].teardown_ms
    assert stored[0].instance_seconds == pytest.approx(held_ms / 1000) and held_ms >= 3.0
    assert stored[1].cpu_ms == 90.0  # the platform's CPU to start workers
    async with sessions.begin() as session:
        assert await usage.cpu_seconds(session, tenant_id=tenant_id, day=NOW.date()) == 0.007
        assert await usage.roll_up(session) == 2
    async with sessions.begin() as session:
        assert await usage.roll_up(session) == 0  # nothing is counted twice
        assert await usage.cpu_seconds(session, tenant_id=tenant_id, day=NOW.date()) == 0.007
        rollups = (await session.scalars(select(UsageRollup).order_by(UsageRollup.kind))).all()
    assert [(r.tenant_id, r.kind, r.events) for r in rollups] == [
        ("", "pool_idle", 1),
        (tenant_id, "run", 1),
    ]
    assert rollups[0].instance_seconds == 120.0 and rollups[1].cpu_ms == 7.0
    assert rollups[0].cpu_ms == 90.0


async def test_open_rows_and_their_jobs_for_the_reconciler(
    writer: BatchWriter, sessions: async_sessionmaker[Any], tenant_id: str
) -> None:
    for n in (1, 2, 3):
        await writer.write(create(tenant_id, n))
    await writer.write(finish(2))
    async with sessions() as session:
        later = datetime.now(UTC)
        opened = await inv.open_rows(session, before=later, limit=10)
        assert [r.id for r in opened] == ["inv_1", "inv_3"]
        assert await inv.open_rows(session, before=NOW, limit=10) == []
        jobs = await inv.jobs_of(session, ["inv_1", "inv_2", "inv_3"])
    assert sorted(jobs) == ["inv_1", "inv_3"]
    async with sessions() as session:
        count = await session.scalar(text("SELECT count(*) FROM usage_events"))
    assert count == 1


async def stored_blobs(sessions: async_sessionmaker[Any]) -> list[tuple[str, str, str, int]]:
    async with sessions() as session:
        found = (await session.scalars(select(Blob).order_by(Blob.invocation_id, Blob.name))).all()
    return [(b.invocation_id, b.tenant_id, b.name, b.size) for b in found]


async def test_large_parts_are_stored_as_blobs_of_the_row_in_its_transaction(
    writer: BatchWriter, sessions: async_sessionmaker[Any], tenant_id: str
) -> None:
    big = "x" * (INLINE_BYTES + 10)
    await writer.write(create(tenant_id, 1, request={"code": big, "stdin": ""}))
    for n in (2, 3):
        await writer.write(create(tenant_id, n))
    # Two final writes in one batch (the multi-row path), and one whose claim is stale.
    stored = await asyncio.gather(
        writer.write(finish(1, stdout=big)),
        writer.write(finish(2, stdout=big + "y")),
        writer.write(finish(3, claim="stale", stdout=big)),
    )
    assert [s is not None for s in stored] == [True, True, False]

    assert await stored_blobs(sessions) == [
        ("inv_1", tenant_id, "request.code", len(big)),
        ("inv_1", tenant_id, "run.stdout", len(big)),
        ("inv_2", tenant_id, "run.stdout", len(big) + 1),
    ]
    first = await row(sessions, 1)
    assert first.stdout == big[:PREVIEW_CHARS] and first.request["code"] == big[:PREVIEW_CHARS]
    async with sessions() as session:
        assert await blobs.used_bytes(session, tenant_id) == 3 * len(big) + 1
        assert await blobs.used_bytes(session, "ten_other") == 0
        ids = [ref["id"] for ref in first.result["$blobs"].values()]  # type: ignore[index]
        assert list((await blobs.fetch(session, ids)).values()) == [big.encode()]


async def test_retention_deletes_what_outlived_it_and_nothing_open_or_uncounted(
    writer: BatchWriter, sessions: async_sessionmaker[Any], tenant_id: str
) -> None:
    big = "x" * (INLINE_BYTES + 1)
    for n in (1, 2):
        await writer.write(create(tenant_id, n))
    await writer.write(finish(1, stdout=big))  # inv_2 stays open
    async with sessions.begin() as session:
        assert await usage.roll_up(session) == 1
    await writer.write(create(tenant_id, 3))
    await writer.write(finish(3))  # its usage event is not rolled up yet
    keep = Retention(
        blobs=timedelta(hours=1), invocations=timedelta(days=30), usage_events=timedelta(days=90)
    )

    nothing = await sweep(sessions, keep, NOW)
    assert (nothing.blobs, nothing.invocations, nothing.usage_events) == (0, 0, 0)

    later = await sweep(sessions, keep, datetime.now(UTC) + timedelta(hours=2))
    assert (later.blobs, later.invocations, later.usage_events) == (1, 0, 0)
    assert await stored_blobs(sessions) == []
    assert (await row(sessions, 1)).stdout == big[:PREVIEW_CHARS]  # the preview stays

    await writer.write(create(tenant_id, 4))
    await writer.write(finish(4, stdout=big))
    much_later = await sweep(sessions, keep, datetime.now(UTC) + timedelta(days=100))
    assert (much_later.blobs, much_later.invocations, much_later.usage_events) == (0, 3, 1)
    async with sessions() as session:
        left = (await session.scalars(select(Invocation.id))).all()
        unrolled = (await session.scalars(select(UsageEvent.subject_id))).all()
    assert left == ["inv_2"]  # open: the reconciler's
    assert sorted(unrolled) == ["inv_3", "inv_4"]  # not counted in the rollups yet: kept
    assert await stored_blobs(sessions) == []  # inv_4's went with its row


def test_the_row_record_has_exactly_the_tables_columns() -> None:
    """``InvocationRow`` stands in for ``Invocation`` on the hot path: the same columns,
    so that an answer built from either shows the same fields."""
    assert {f.name for f in fields(inv.InvocationRow)} == set(Invocation.__table__.columns.keys())
