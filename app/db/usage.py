"""Usage: append-only events, and hourly rollups derived from them.

Every final invocation appends one ``usage_events`` row in the transaction that stores
it (copied from the stored row itself, so it says what the record says); warm pools
append idle-capacity events with no tenant (the platform pays for them). An event is
unique by its subject, so storing one twice (a recorder that read it again) stores it
once. Nothing on the
hot path updates a shared counter row. ``roll_up`` (run by the elected reconciler) marks
a batch of events rolled and adds them to ``usage_rollups`` per tenant, UTC hour and
kind, in one transaction: an event is counted exactly once, whatever the order in which
concurrent transactions committed it. Readers add the rollups and the events not rolled
up yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, cast

from sqlalchemy import (
    Connection,
    Table,
    bindparam,
    delete,
    false,
    func,
    insert,
    literal,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Invocation, Sandbox, UsageEvent, UsageRollup
from app.db.prepared import Prepared
from wire.messages import PoolUsage

_EVENTS = cast(Table, UsageEvent.__table__)
_ROLLUPS = cast(Table, UsageRollup.__table__)
_INV = cast(Table, Invocation.__table__)
_SANDBOXES = cast(Table, Sandbox.__table__)
#: the states of a sandbox whose record may read CPU not metered yet
_LIVE_SANDBOX_STATES = ("creating", "running", "paused")

COSTS = ("queue_ms", "setup_ms", "exec_ms", "teardown_ms", "cpu_ms")
COUNTS = ("bytes_in", "bytes_out", "retries")
SUMS = (*COSTS, "instance_seconds", "memory_mb_seconds", "stored_gb_seconds", *COUNTS)
#: What a rollup row is keyed by besides tenant and hour ("" where an event has none).
DIMENSIONS = ("kind", "runtime", "language", "function_version_id")
#: The rollup row of the platform's own usage (idle warm capacity).
PLATFORM = ""
#: Events rolled up per transaction.
ROLL_BATCH = 20_000

# One event per stored invocation, copied from its row.
_EVENT_COLUMNS = [
    "occurred_at",
    "tenant_id",
    "subject",
    "subject_id",
    "kind",
    "runtime",
    "language",
    "function_version_id",
    "node_id",
    "status",
    *COSTS,
    "peak_memory_kb",
    "instance_seconds",
    "memory_mb_seconds",
    "stored_gb_seconds",
    *COUNTS,
    "rolled",
]
_EVENT_OF_ROW = select(
    _INV.c.finished_at,
    _INV.c.tenant_id,
    literal("invocation"),
    _INV.c.id,
    _INV.c.kind,
    _INV.c.runtime,
    _INV.c.language,
    _INV.c.function_version_id,
    _INV.c.node_id,
    _INV.c.status,
    *(func.coalesce(_INV.c[name], 0.0) for name in COSTS),
    _INV.c.peak_memory_kb,
    # the instance (a jail, a wasm instance) the call held: from its setup to its
    # teardown, so a call that started its own jail pays for that start
    (
        func.coalesce(_INV.c.setup_ms, 0.0)
        + func.coalesce(_INV.c.exec_ms, 0.0)
        + func.coalesce(_INV.c.teardown_ms, 0.0)
    )
    / 1000.0,
    # the call's memory held for its run: its peak, for as long as it ran
    func.coalesce(_INV.c.peak_memory_kb, 0) / 1024.0 * func.coalesce(_INV.c.exec_ms, 0.0) / 1000.0,
    literal(0.0),
    func.coalesce(_INV.c.bytes_in, 0),
    func.coalesce(_INV.c.bytes_out, 0),
    _INV.c.attempts - 1,
    false(),
)
# one statement per batch; a lone row's (the common case at low load) prepared
_FROM_ROWS = insert(_EVENTS).from_select(
    _EVENT_COLUMNS, _EVENT_OF_ROW.where(_INV.c.id.in_(bindparam("ids", expanding=True)))
)
_FROM_ROW = Prepared(
    insert(_EVENTS).from_select(_EVENT_COLUMNS, _EVENT_OF_ROW.where(_INV.c.id == bindparam("id")))
)


def record_invocations(conn: Connection, ids: Sequence[str]) -> None:
    """Append the usage events of invocations just stored as final (inside the
    lifecycle's batch: a synchronous connection, ``app.db.transactions``)."""
    if len(ids) == 1 or Prepared.on_cursor(conn):
        # on sqlite3's cursor a batch is the one-row statement run for each row (the IN
        # statement's expanding parameter is compiled again for every batch size: 10 % of
        # the SQLite writer thread at concurrency 32); in id order, the order in which the
        # IN statement reads them through the primary key, so the events are numbered alike
        _FROM_ROW.execute(conn, [{"id": invocation_id} for invocation_id in sorted(ids)])
    else:
        conn.execute(_FROM_ROWS, {"ids": list(ids)})


async def record_pool_usage(session: AsyncSession, events: Sequence[PoolUsage]) -> None:
    """Append idle-capacity events of warm pools (no tenant: the platform's cost)."""
    if not events:
        return
    conn = await session.connection()
    insert_ = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    await conn.execute(
        insert_(_EVENTS).on_conflict_do_nothing(index_elements=["subject", "subject_id"]),
        [
            {
                "occurred_at": datetime.fromtimestamp(e.period_end, UTC),
                "tenant_id": None,
                "subject": "pool",
                "subject_id": f"{e.node_id}:{e.pool}:{e.period_end:.3f}",
                "kind": "pool_idle",
                "runtime": e.pool.split("/", 1)[0],
                "node_id": e.node_id,
                **dict.fromkeys(COSTS, 0.0),
                "cpu_ms": e.start_cpu_ms,  # starting workers, a caller waiting or not
                "instance_seconds": e.idle_instance_seconds,
                "memory_mb_seconds": e.idle_memory_mb_seconds,
                "stored_gb_seconds": 0.0,
                **dict.fromkeys(COUNTS, 0),
                "rolled": False,
            }
            for e in events
        ],
    )


def _upsert(insert_: Any) -> Any:
    """``INSERT .. ON CONFLICT (tenant, hour, dimensions) DO UPDATE`` adding to the sums."""
    stmt = insert_(_ROLLUPS)
    counters = ("events", "failures", *SUMS)
    return stmt.on_conflict_do_update(
        index_elements=["tenant_id", "hour", *DIMENSIONS],
        set_={name: _ROLLUPS.c[name] + stmt.excluded[name] for name in counters},
    )


_UPSERT = {"postgresql": _upsert(pg_insert), "sqlite": _upsert(sqlite_insert)}
_PENDING = select(_EVENTS.c.id).where(_EVENTS.c.rolled == false()).order_by(_EVENTS.c.id)


async def roll_up(session: AsyncSession, *, batch: int = ROLL_BATCH) -> int:
    """Move up to ``batch`` events into the hourly rollups; how many were moved."""
    conn = await session.connection()
    marked = await conn.execute(
        update(_EVENTS)
        .where(
            _EVENTS.c.id.in_(_PENDING.limit(batch).scalar_subquery()), _EVENTS.c.rolled == false()
        )
        .values(rolled=true())
        .returning(
            _EVENTS.c.tenant_id,
            _EVENTS.c.occurred_at,
            *(_EVENTS.c[name] for name in DIMENSIONS),
            _EVENTS.c.status,
            *(_EVENTS.c[name] for name in SUMS),
        )
    )
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    count = 0
    for event in marked:
        count += 1
        occurred = event.occurred_at
        if occurred.tzinfo is None:
            occurred = occurred.replace(tzinfo=UTC)
        hour = occurred.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        dims = tuple(getattr(event, name) or "" for name in DIMENSIONS)
        key = (event.tenant_id or PLATFORM, hour, *dims)
        row = rows.get(key)
        if row is None:
            row = rows[key] = {
                "tenant_id": key[0],
                "hour": hour,
                **dict(zip(DIMENSIONS, dims, strict=True)),
                "events": 0,
                "failures": 0,
                **dict.fromkeys(SUMS, 0.0),
                **dict.fromkeys(COUNTS, 0),
            }
        row["events"] += 1
        row["failures"] += 1 if event.status in ("failed", "errored") else 0
        for name in SUMS:
            value = getattr(event, name) or 0
            row[name] += int(value) if name in COUNTS else float(value)
    if rows:
        values = [rows[key] for key in sorted(rows)]  # one lock order for every roller
        await conn.execute(_UPSERT[conn.dialect.name], values)
    return count


async def delete_rolled(session: AsyncSession, *, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` events counted in the rollups that occurred before
    ``before`` (the rollups keep their sums); how many."""
    doomed = (
        select(_EVENTS.c.id)
        .where(_EVENTS.c.rolled == true(), _EVENTS.c.occurred_at < before)
        .order_by(_EVENTS.c.id)
        .limit(limit)
        .scalar_subquery()
    )
    result = await session.execute(delete(_EVENTS).where(_EVENTS.c.id.in_(doomed)))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time(0), tzinfo=UTC)
    return start, start + timedelta(days=1)


async def cpu_seconds(
    session: AsyncSession, *, tenant_id: str, day: date, live_sandboxes: bool = False
) -> float:
    """CPU-seconds a tenant used on a UTC day: rolled up, plus not rolled up yet, read in
    one statement (one snapshot: an event rolled up between two reads would be missed).
    With ``live_sandboxes`` (for today), plus the CPU its live sandboxes' records read that
    no usage event holds yet (``app.sandboxes.metering`` moves it into one, with the
    record's ``metered_cpu_ms``, in one transaction: the same statement sees either)."""
    start, end = day_bounds(day)
    rolled = select(_ROLLUPS.c.cpu_ms.label("cpu_ms")).where(
        _ROLLUPS.c.tenant_id == tenant_id, _ROLLUPS.c.hour >= start, _ROLLUPS.c.hour < end
    )
    pending = select(_EVENTS.c.cpu_ms).where(
        _EVENTS.c.rolled == false(),
        _EVENTS.c.tenant_id == tenant_id,
        _EVENTS.c.occurred_at >= start,
        _EVENTS.c.occurred_at < end,
    )
    parts = [rolled, pending]
    if live_sandboxes:
        parts.append(
            select(
                (
                    func.coalesce(_SANDBOXES.c.cpu_ms, 0.0)
                    - func.coalesce(_SANDBOXES.c.metered_cpu_ms, 0.0)
                ).label("cpu_ms")
            ).where(
                _SANDBOXES.c.tenant_id == tenant_id,
                _SANDBOXES.c.state.in_(_LIVE_SANDBOX_STATES),
                _SANDBOXES.c.cpu_ms > func.coalesce(_SANDBOXES.c.metered_cpu_ms, 0.0),
            )
        )
    both = union_all(*parts).subquery()
    total = await session.scalar(select(func.coalesce(func.sum(both.c.cpu_ms), 0.0)))
    return float(total or 0.0) / 1000.0
