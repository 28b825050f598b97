"""Sandbox rows under compare-and-set: a writer moves a row only from what it read, a
row that ended is never moved again, and readings never move ``version``. SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import async_sessionmaker

from app.db import sandboxes as rows
from app.db import tenants
from app.db.engine import make_engine, make_sessionmaker
from app.db.migrate import upgrade
from app.db.models import Sandbox
from app.quotas.spec import QuotaLimits
from app.settings import Settings


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path}/s.db"
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
async def running(sessions: async_sessionmaker[Any]) -> Sandbox:
    async with sessions.begin() as session:
        tenant, _key, _plain = await tenants.create_tenant(session, name="t", quota=QuotaLimits())
        row = Sandbox(
            id="sbx_1",
            tenant_id=tenant.id,
            backend="crun",
            image="python",
            node_id="node-a",
            state="running",
            version=0,
        )
        session.add(row)
    return row


async def stored(sessions: async_sessionmaker[Any]) -> Sandbox:
    async with sessions() as session:
        found = await session.get(Sandbox, "sbx_1")
    assert found is not None
    return found


async def move(sessions: async_sessionmaker[Any], seen: rows.Versioned, **values: Any) -> bool:
    async with sessions.begin() as session:
        return await rows.transition(session, seen, **values)


async def test_a_writer_moves_the_row_only_from_what_it_read(
    sessions: async_sessionmaker[Any], running: Sandbox
) -> None:
    read_by_sync = rows.Seen.of(running)
    read_by_destroy = rows.Seen.of(running)
    now = datetime.now(UTC)
    assert await move(sessions, read_by_destroy, state="stopped", reason="destroyed", ended_at=now)
    # the sync that read "running" before the destroy: its write is refused
    assert not await move(sessions, read_by_sync, state="paused")
    row = await stored(sessions)
    assert (row.state, row.reason, row.version) == ("stopped", "destroyed", 1)


async def test_a_row_that_ended_is_never_moved_again(
    sessions: async_sessionmaker[Any], running: Sandbox
) -> None:
    assert await move(sessions, running, state="stopped", reason="destroyed")
    ended = await stored(sessions)
    assert ended.version == 1
    # even from the row as it now is
    assert not await move(sessions, ended, state="running")
    assert not await move(
        sessions, rows.Seen("sbx_1", running.tenant_id, {}, "running", "node-a", 1), state="running"
    )
    assert (await stored(sessions)).state == "stopped"


async def test_a_transition_also_checks_the_node_and_state_it_read(
    sessions: async_sessionmaker[Any], running: Sandbox
) -> None:
    assert not await move(
        sessions, rows.Seen("sbx_1", running.tenant_id, {}, "running", "node-b", 0), state="paused"
    )
    assert not await move(
        sessions, rows.Seen("sbx_1", running.tenant_id, {}, "creating", "node-a", 0), state="paused"
    )
    assert await move(
        sessions, rows.Seen("sbx_1", running.tenant_id, {}, "running", "node-a", 0), state="paused"
    )
    assert (await stored(sessions)).state == "paused"


async def test_readings_land_only_in_the_state_they_were_read_and_move_no_version(
    sessions: async_sessionmaker[Any], running: Sandbox
) -> None:
    async with sessions.begin() as session:
        await rows.store_readings(session, [rows.Reading("sbx_1", "running", 12.5, 1024)])
    row = await stored(sessions)
    assert (row.cpu_ms, row.memory_bytes, row.version) == (12.5, 1024, 0)
    assert await move(sessions, row, state="stopped")
    async with sessions.begin() as session:
        await rows.store_readings(session, [rows.Reading("sbx_1", "running", 99.0, 1)])
    assert (await stored(sessions)).cpu_ms == 12.5


async def test_creates_racing_for_the_last_room_are_admitted_exactly_as_far_as_it_goes(
    sessions: async_sessionmaker[Any], running: Sandbox
) -> None:
    """Eight gateways' creates at once, three places in the quota and one held: two are
    recorded, whatever the interleaving (the totals row decides, not a count)."""
    quota = QuotaLimits(max_concurrent_sandboxes=3)
    async with sessions.begin() as session:  # one place held
        assert await rows.admit(session, _new(running.tenant_id, "sbx_held"), quota)

    async def one(n: int) -> bool:
        async with sessions.begin() as session:
            return await rows.admit(session, _new(running.tenant_id, f"sbx_{n}0"), quota)

    outcomes = await asyncio.gather(*(one(n) for n in range(8)))
    assert sum(outcomes) == 2
    async with sessions() as session:
        held = await rows.held(session, running.tenant_id)
    assert (held.count, held.memory_mb) == (3, 3 * 512)


async def test_a_tenants_first_creates_at_once_each_find_the_totals_row_one_of_them_made(
    sessions: async_sessionmaker[Any], running: Sandbox
) -> None:
    """No totals row yet: every create but one finds it made by another (on PostgreSQL
    its insert waited for that one's commit) and is judged on it, not refused."""
    quota = QuotaLimits(max_concurrent_sandboxes=3)

    async def one(n: int) -> bool:
        async with sessions.begin() as session:
            return await rows.admit(session, _new(running.tenant_id, f"sbx_{n}0"), quota)

    outcomes = await asyncio.gather(*(one(n) for n in range(6)))
    assert sum(outcomes) == 3
    async with sessions() as session:
        assert (await rows.held(session, running.tenant_id)).count == 3


async def test_a_row_that_left_the_live_states_is_never_moved_back_into_them(
    sessions: async_sessionmaker[Any], running: Sandbox
) -> None:
    assert await move(sessions, running, state="stopping", reason="destroyed")
    stopping = await stored(sessions)
    assert not await move(sessions, stopping, state="running")
    assert await move(sessions, stopping, state="stopped")
    assert (await stored(sessions)).state == "stopped"


async def test_a_row_leaving_the_live_states_frees_its_room_once(
    sessions: async_sessionmaker[Any], running: Sandbox
) -> None:
    quota = QuotaLimits(max_concurrent_sandboxes=1)
    row = _new(running.tenant_id, "sbx_one")
    async with sessions.begin() as session:
        assert await rows.admit(session, row, quota)
    assert await move(sessions, row, state="stopping", reason="destroyed")
    assert not await move(sessions, row, state="stopped")  # stale: changes nothing
    async with sessions() as session:
        assert (await rows.held(session, running.tenant_id)).count == 0
    async with sessions.begin() as session:
        assert await rows.admit(session, _new(running.tenant_id, "sbx_two"), quota)


def _new(tenant_id: str, sandbox_id: str) -> Sandbox:
    return Sandbox(
        id=sandbox_id,
        tenant_id=tenant_id,
        backend="crun",
        image="python",
        node_id="node-a",
        state="running",
        spec={"memory_mb": 512, "cpu": 1.0, "disk_mb": 1024},
        meta={},
        created_at=datetime.now(UTC),
        version=0,
    )
