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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from sqlalchemy import Table, and_, bindparam, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Sandbox
from wire.sandboxes import SandboxState

_T = cast(Table, Sandbox.__table__)
#: a row in one of these states is final: no transition moves it again
ENDED = (SandboxState.STOPPED.value,)


class Versioned(Protocol):
    """What a writer read of a row (a ``Sandbox`` has it)."""

    @property
    def id(self) -> str: ...

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
    state: str
    node_id: str | None
    version: int

    @classmethod
    def of(cls, row: Versioned) -> Seen:
        return cls(row.id, row.state, row.node_id, row.version)


def _as_read(seen: Versioned) -> Any:
    node = _T.c.node_id.is_(None) if seen.node_id is None else _T.c.node_id == seen.node_id
    return and_(
        _T.c.id == seen.id,
        _T.c.version == seen.version,
        _T.c.state == seen.state,
        node,
        _T.c.state.not_in(ENDED),
    )


async def transition(session: AsyncSession, seen: Versioned, **values: Any) -> bool:
    """Move the row from what ``seen`` read to ``values`` (in the session's transaction);
    False if another writer moved it since, or it had ended: nothing is written then."""
    if seen.state in ENDED:
        return False
    moved = await session.execute(
        update(_T).where(_as_read(seen)).values(**values, version=_T.c.version + 1)
    )
    return int(moved.rowcount) == 1  # type: ignore[attr-defined]


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
