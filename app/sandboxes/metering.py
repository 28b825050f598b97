"""Usage events of sandboxes while they live, metered by the gateway from their records.

A pass appends, for each sandbox that has started and is live (creating excluded: it has
not started; paused included: it holds its memory) or has ended without being metered to
its end (stopped, or destroyed and not yet torn down: ``stopping``, which ended when its
destroy was acknowledged), one ``usage_events`` row for the interval from where its
metering stopped (``metered_until``, else ``started_at``) to now (a live one, once the
interval is ``every_s`` long) or to ``ended_at`` (one that ended): subject ``sandbox``, subject id
``<id>@<start, epoch ms>``, kind ``sandbox``, the tenant, runtime the backend, the node,
status the state; ``instance_seconds`` the interval, ``memory_mb_seconds`` the reserved
``memory_mb`` times it, ``cpu_ms`` what the record's CPU reading grew since the last
interval (``metered_cpu_ms``: CPU the record has not read from the node yet falls in a
later interval), and on the first interval the create's phases (``queue_ms``;
``setup_ms`` is image + setup + start).

The event and the row's ``metered_until`` are written in one transaction, and the row is
moved only from the ``metered_until`` and state the pass read: a pass that crashed stored
both or neither, and two passes racing (the leader's and the one made when a sandbox is
recorded stopped) store an interval once. Records are the only input, so it works for
every backend and goes on where it stopped after a gateway restart.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, cast

from sqlalchemy import Connection, Table, and_, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import Sandbox, UsageEvent
from app.db.transactions import Batchable, Transactions
from wire.sandboxes import SandboxState

log = logging.getLogger(__name__)

SUBJECT = "sandbox"
KIND = "sandbox"
#: a sandbox that ended this long ago and was not metered to its end is left alone (the
#: pass made when it is recorded stopped meters it; this only catches one that failed)
CATCH_UP = timedelta(days=1)
METERED = (SandboxState.RUNNING.value, SandboxState.PAUSED.value)
#: ended at ``ended_at``: a destroyed sandbox is charged up to its destroy's acknowledgment,
#: however long its teardown takes (``stopping``)
ENDED = (SandboxState.STOPPING.value, SandboxState.STOPPED.value)

_EVENTS = cast(Table, UsageEvent.__table__)


def _due(row: Sandbox, now: datetime, every_s: float) -> tuple[datetime, datetime] | None:
    """The interval to record for ``row`` now, if any."""
    if row.started_at is None:
        return None
    start = row.metered_until or row.started_at
    if row.state in ENDED:
        end = row.ended_at
        if end is None or end <= start:
            return None
        return start, end
    if (now - start).total_seconds() < max(every_s, 0.0) or now <= start:
        return None
    return start, now


def _event(row: Sandbox, start: datetime, end: datetime) -> dict[str, Any]:
    seconds = (end - start).total_seconds()
    first = row.metered_until is None
    memory_mb = int((row.spec or {}).get("memory_mb", 0))
    setup = sum(v or 0.0 for v in (row.image_ms, row.setup_ms, row.start_ms))
    return {
        "occurred_at": end,
        "tenant_id": row.tenant_id,
        "subject": SUBJECT,
        "subject_id": f"{row.id}@{round(start.timestamp() * 1000)}",
        "kind": KIND,
        "runtime": row.backend,
        "language": None,
        "function_version_id": None,
        "node_id": row.node_id,
        "status": row.state,
        "queue_ms": (row.queue_ms or 0.0) if first else 0.0,
        "setup_ms": setup if first else 0.0,
        "exec_ms": 0.0,
        "teardown_ms": 0.0,
        "cpu_ms": max(0.0, (row.cpu_ms or 0.0) - (row.metered_cpu_ms or 0.0)),
        "peak_memory_kb": None,
        "instance_seconds": seconds,
        "memory_mb_seconds": memory_mb * seconds,
        "rolled": False,
    }


def record_on(conn: Connection, row: Sandbox, start: datetime, end: datetime) -> bool:
    """Store ``row``'s interval, unless another pass moved the row since it was read."""
    read = (
        Sandbox.metered_until.is_(None)
        if row.metered_until is None
        else Sandbox.metered_until == row.metered_until
    )
    moved = conn.execute(
        update(Sandbox)
        .where(Sandbox.id == row.id, Sandbox.state == row.state, read)
        .values(metered_until=end, metered_cpu_ms=row.cpu_ms)
    )
    if moved.rowcount != 1:
        return False
    insert_ = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    conn.execute(
        insert_(_EVENTS).on_conflict_do_nothing(index_elements=["subject", "subject_id"]),
        [_event(row, start, end)],
    )
    return True


class Interval(Batchable):
    """``record_on`` as a write of a committer (``app.db.transactions``): a sandbox's
    last interval is stored as it is recorded stopped, in one commit on the event loop
    on the embedded SQLite file."""

    stage: ClassVar[int] = 12

    def __init__(self, row: Sandbox, start: datetime, end: datetime) -> None:
        self.row, self.start, self.end = row, start, end

    @classmethod
    def run_many(cls, conn: Connection, writes: Sequence[Interval]) -> list[Any]:
        return [record_on(conn, w.row, w.start, w.end) for w in writes]


async def meter_ended(transactions: Transactions, row: Sandbox) -> bool:
    """Store the last interval of ``row``, just recorded stopped (as the writer that
    stopped it holds it); False if there was none to store or a pass stored it first."""
    interval = _due(row, datetime.now(UTC), 0.0)
    if interval is None:
        return False
    (stored,) = await transactions.run([Interval(row, *interval)])
    return bool(stored)


async def _rows(
    sessions: async_sessionmaker[AsyncSession], now: datetime, sandbox_id: str | None
) -> Sequence[Sandbox]:
    query = select(Sandbox).where(Sandbox.started_at.is_not(None))
    if sandbox_id is not None:
        query = query.where(Sandbox.id == sandbox_id)
    else:
        ended = and_(
            Sandbox.state.in_(ENDED),
            Sandbox.ended_at >= now - CATCH_UP,
            or_(Sandbox.metered_until.is_(None), Sandbox.metered_until < Sandbox.ended_at),
        )
        query = query.where(or_(Sandbox.state.in_(METERED), ended))
    async with sessions() as session:
        return (await session.scalars(query)).all()


async def meter(
    sessions: async_sessionmaker[AsyncSession],
    *,
    now: datetime,
    every_s: float,
    sandbox_id: str | None = None,
) -> int:
    """Record the intervals due at ``now`` (of one sandbox, or all); how many."""
    stored = 0
    for row in await _rows(sessions, now, sandbox_id):
        interval = _due(row, now, every_s)
        if interval is None:
            continue
        async with sessions.begin() as session:
            conn = await session.connection()
            if await conn.run_sync(record_on, row, *interval):
                stored += 1
                log.debug(
                    "sandbox=%s: metered %s .. %s", row.id, *(t.isoformat() for t in interval)
                )
    return stored
