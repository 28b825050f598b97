"""Sandbox rows: one rule for writes, as invocations have (``app.db.invocations``).

Several writers move a sandbox's row: the request handlers of any gateway (create,
destroy, pause, resume, timeout), the teardown that ends a destroy, and the leader's
``sync`` that makes rows agree with the nodes. Each reads the row, acts (usually on the
node), then stores the outcome by **compare-and-set**: the row is moved only from the
``(state, node_id, version)`` the writer read, and every transition adds one to
``version``. A writer that lost the race changes nothing and learns it (``False``);
it then reads the row again and goes by what it finds, never by what it read before.
So a pass that read ``running`` before a concurrent destroy cannot store ``running``
after it, and a row that has ended (``stopped``) is never moved again: ``ENDED`` rows
are excluded by the statement itself, whatever the writer read.

Reads never write: a ``GET`` of a sandbox shows the node's live readings without storing
them (the leader's ``sync`` stores what lasts). The node's CPU and memory readings of
live sandboxes are not transitions: ``store_readings`` writes them where the row is
still in the state the reader saw, without moving ``version`` (so a reading never makes
a transition fail). Metering moves ``metered_until`` by its own compare-and-set on
``(state, metered_until)`` (``app.sandboxes.metering``), which transitions do not touch.

**The tenant's totals** (``sandbox_totals``: how many live sandboxes, their memory, CPU
and disk) are kept by the same transactions: ``admit`` adds a new sandbox by a
conditional update of the totals row (which two gateways cannot both pass past the
quota: PostgreSQL re-checks the condition on the row version it waited for, SQLite has
one writer) and inserts its row; a transition that takes a row out of the live states
takes its size off. A row never comes back to a live state once it left them, and only
one transition from what a writer read can succeed, so each sandbox is added once and
taken off once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, cast

from sqlalchemy import Connection, Table, and_, bindparam, insert, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Sandbox, SandboxTotals
from app.db.reads import KeyRead
from app.db.transactions import Batchable
from app.quotas.spec import QuotaLimits
from app.sandboxes.admission import Ask, Held, milli
from wire.sandboxes import SandboxState

_T = cast(Table, Sandbox.__table__)
_TOTALS = cast(Table, SandboxTotals.__table__)
#: a row in one of these states is final: no transition moves it again
ENDED = (SandboxState.STOPPED.value,)
#: the states whose sandboxes count in the tenant's totals (its quota of live ones)
LIVE = (SandboxState.CREATING.value, SandboxState.RUNNING.value, SandboxState.PAUSED.value)


class Versioned(Protocol):
    """What a writer read of a row (a ``Sandbox`` has it)."""

    @property
    def id(self) -> str: ...

    @property
    def tenant_id(self) -> str: ...

    @property
    def spec(self) -> dict[str, Any]: ...

    @property
    def state(self) -> str: ...

    @property
    def node_id(self) -> str | None: ...

    @property
    def version(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Seen:
    """A row's transition key as a writer read it."""

    id: str
    tenant_id: str
    spec: dict[str, Any]
    state: str
    node_id: str | None
    version: int

    @classmethod
    def of(cls, row: Versioned) -> Seen:
        return cls(row.id, row.tenant_id, row.spec, row.state, row.node_id, row.version)


def _as_read(seen: Versioned) -> Any:
    node = _T.c.node_id.is_(None) if seen.node_id is None else _T.c.node_id == seen.node_id
    return and_(
        _T.c.id == seen.id,
        _T.c.version == seen.version,
        _T.c.state == seen.state,
        node,
        _T.c.state.not_in(ENDED),
    )


def transition_on(conn: Connection, seen: Versioned, **values: Any) -> bool:
    """Move the row from what ``seen`` read to ``values`` (in the connection's
    transaction); False if another writer moved it since, or it had ended: nothing is
    written then. A row that leaves the live states takes its size off the tenant's
    totals in the same transaction (exactly once: only one transition from what was read
    can succeed)."""
    if seen.state in ENDED:
        return False
    if seen.state not in LIVE and values.get("state", seen.state) in LIVE:
        return False  # destroyed: never live again (nor counted again)
    moved = conn.execute(
        update(_T).where(_as_read(seen)).values(**values, version=_T.c.version + 1)
    )
    if int(moved.rowcount) != 1:
        return False
    if seen.state in LIVE and values.get("state", seen.state) not in LIVE:
        _add(conn, seen.tenant_id, Ask.of(seen.spec or {}), sign=-1)
    return True


def _add(conn: Connection, tenant_id: str, ask: Ask, *, sign: int) -> None:
    conn.execute(
        update(_TOTALS)
        .where(_TOTALS.c.tenant_id == tenant_id)
        .values(
            live=_TOTALS.c.live + sign,
            memory_mb=_TOTALS.c.memory_mb + sign * ask.memory_mb,
            cpu_milli=_TOTALS.c.cpu_milli + sign * milli(ask.cpu),
            disk_mb=_TOTALS.c.disk_mb + sign * ask.disk_mb,
        )
    )


def admit_on(conn: Connection, row: Sandbox, quota: QuotaLimits) -> bool:
    """Record a new live sandbox if the tenant's totals, with it, stay within ``quota``:
    one conditional update of the tenant's ``sandbox_totals`` row (two gateways admitting
    at once take turns on that row, and each judges the totals the other left), then the
    row's insert, in the connection's transaction. False: past the quota (no row
    written). A tenant's first create makes its totals row."""
    ask = Ask.of(row.spec or {})
    take = (
        update(_TOTALS)
        .where(
            _TOTALS.c.tenant_id == row.tenant_id,
            _TOTALS.c.live + 1 <= quota.max_concurrent_sandboxes,
            _TOTALS.c.memory_mb + ask.memory_mb <= quota.max_sandboxes_memory_mb,
            _TOTALS.c.cpu_milli + milli(ask.cpu) <= milli(quota.max_sandboxes_cpu),
            _TOTALS.c.disk_mb + ask.disk_mb <= quota.max_sandboxes_disk_mb,
        )
        .values(
            live=_TOTALS.c.live + 1,
            memory_mb=_TOTALS.c.memory_mb + ask.memory_mb,
            cpu_milli=_TOTALS.c.cpu_milli + milli(ask.cpu),
            disk_mb=_TOTALS.c.disk_mb + ask.disk_mb,
        )
    )
    if int(conn.execute(take).rowcount) != 1:
        # past the quota, or no totals row yet: make it (another create may have made it
        # meanwhile, its insert waited for here), then judge again on the row as it is
        _first_totals(conn, row.tenant_id)
        if int(conn.execute(take).rowcount) != 1:
            return False
    conn.execute(insert(_T).values(**_values(row)))
    return True


def _first_totals(conn: Connection, tenant_id: str) -> None:
    """Make the tenant's totals row (empty), unless it is there already."""
    insert_ = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    conn.execute(
        insert_(_TOTALS)
        .values(tenant_id=tenant_id, live=0, memory_mb=0, cpu_milli=0, disk_mb=0)
        .on_conflict_do_nothing(index_elements=["tenant_id"])
    )


def _values(row: Sandbox) -> dict[str, Any]:
    """The row's column values (those not set take their defaults)."""
    return {
        column.key: getattr(row, column.key)
        for column in _T.columns
        if getattr(row, column.key, None) is not None
    }


class Transition(Batchable):
    """``transition_on`` as a write of a committer (``app.db.transactions``): on the
    embedded SQLite file a whole transaction on the event loop when the write lock is
    free, not a session's statements each a trip through a driver's thread."""

    stage: ClassVar[int] = 10

    def __init__(self, seen: Versioned, values: dict[str, Any]) -> None:
        self.seen = Seen.of(seen)
        self.values = values

    @classmethod
    def run_many(cls, conn: Connection, writes: Sequence[Transition]) -> list[Any]:
        return [transition_on(conn, w.seen, **w.values) for w in writes]


class Admit(Batchable):
    """``admit_on`` as a write of a committer (as ``Transition``)."""

    stage: ClassVar[int] = 11

    def __init__(self, row: Sandbox, quota: QuotaLimits) -> None:
        self.row = row
        self.quota = quota

    @classmethod
    def run_many(cls, conn: Connection, writes: Sequence[Admit]) -> list[Any]:
        return [admit_on(conn, w.row, w.quota) for w in writes]


#: what the tenant's live sandboxes hold together, read by the tenant's id
HELD = KeyRead(
    _TOTALS.c.tenant_id,
    [_TOTALS.c.live, _TOTALS.c.memory_mb, _TOTALS.c.cpu_milli, _TOTALS.c.disk_mb],
)


def held_of(values: tuple[Any, ...] | None) -> Held:
    """``HELD``'s values as a ``Held`` (nothing if the tenant never made a sandbox)."""
    return Held() if values is None else Held(*values)


# --- the same, in an AsyncSession's transaction ------------------------------------------
async def transition(session: AsyncSession, seen: Versioned, **values: Any) -> bool:
    conn = await session.connection()
    return await conn.run_sync(lambda c: transition_on(c, seen, **values))


async def admit(session: AsyncSession, row: Sandbox, quota: QuotaLimits) -> bool:
    conn = await session.connection()
    return await conn.run_sync(lambda c: admit_on(c, row, quota))


async def held(session: AsyncSession, tenant_id: str) -> Held:
    """What the tenant's live sandboxes hold together (nothing if it never made one)."""
    conn = await session.connection()
    return held_of(await conn.run_sync(lambda c: HELD.on(c, tenant_id)))


@dataclass(frozen=True, slots=True)
class Reading:
    """A node's CPU and memory reading of a live sandbox, in the state it was read."""

    id: str
    state: str
    cpu_ms: float | None
    memory_bytes: int | None


_STORE_READING = (
    update(_T)
    .where(_T.c.id == bindparam("b_id"), _T.c.state == bindparam("b_state"))
    .values(cpu_ms=bindparam("b_cpu_ms"), memory_bytes=bindparam("b_memory_bytes"))
)


async def store_readings(session: AsyncSession, readings: Sequence[Reading]) -> None:
    """The readings, each where its row is still in the state it was read (one
    statement for all; ``version`` unmoved)."""
    if not readings:
        return
    conn = await session.connection()
    await conn.execute(
        _STORE_READING,
        [
            {
                "b_id": r.id,
                "b_state": r.state,
                "b_cpu_ms": r.cpu_ms,
                "b_memory_bytes": r.memory_bytes,
            }
            for r in readings
        ],
    )
