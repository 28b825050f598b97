"""Dead letters: node reports the recorder gave up storing (``app.invocations.recorder``).

A report lands here, with the last failure, after its write failed ``record_tries`` times
for a reason of its own (not a lost connection: the database being away is waited out,
never dead-lettered). Its invocation is ended ``errored`` with ``RESULT_NOT_STORED`` in
the same transaction, under the report's claim, so nothing waits for it and the
reconciler does not run it again. Operators read them through ``GET
/v1/admin/dead-letters`` and the ``corral_recorder_events_total{outcome="dead_lettered"}``
counter; retention deletes them with the invocations.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import cast

from sqlalchemy import Connection, Table, delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import invocations
from app.db.models import DeadLetter, Invocation, utcnow
from wire.ids import new_id

#: The stable prefix of the ``error`` of an invocation whose result went to the dead
#: letters (as "lost:" prefixes one the reconciler failed).
RESULT_NOT_STORED = "result_not_stored"
#: How much of a report a dead letter keeps.
MAX_EVENT_CHARS = 256 * 1024


async def add(
    session: AsyncSession,
    *,
    gateway_id: str,
    kind: str,
    invocation_id: str | None,
    claim: str | None,
    node_id: str | None,
    tries: int,
    error: str,
    event: str,
    usage: bool,
) -> tuple[DeadLetter, invocations.Stored | None]:
    """Keep a report as a dead letter and, with ``claim``, end its invocation as
    ``errored`` (with its usage event when ``usage``; a report whose write fails may
    fail that too, so the caller can ask for a bare update). Returns the letter and the
    invocation's stored columns (None: not open under ``claim`` any more)."""
    letter = DeadLetter(
        id=new_id("dl"),
        created_at=utcnow(),
        gateway_id=gateway_id,
        kind=kind,
        invocation_id=invocation_id,
        node_id=node_id,
        tries=tries,
        error=error[:4096],
        event=event[:MAX_EVENT_CHARS],
    )
    session.add(letter)
    await session.flush()
    stored: invocations.Stored | None = None
    if invocation_id is not None and claim is not None:
        message = (
            f"{RESULT_NOT_STORED}: the node's result could not be stored after {tries} tries "
            f"(dead letter {letter.id}); not run again"
        )
        fail = invocations.Fail(invocation_id=invocation_id, claim=claim, error=message)
        conn = await session.connection()
        if usage:
            stored = (await conn.run_sync(invocations.Fail.run_many, [fail]))[0]
        else:
            stored = await conn.run_sync(_bare_fail, fail)
    return letter, stored


def _bare_fail(conn: Connection, fail: invocations.Fail) -> invocations.Stored | None:
    """``Fail`` without its usage event or blobs: one UPDATE under the claim."""
    values = fail.values(utcnow())
    table = cast(Table, Invocation.__table__)
    changed = conn.execute(
        update(table)
        .where(
            table.c.id == fail.invocation_id,
            table.c.claim == fail.claim,
            table.c.status.in_(list(invocations.OPEN)),
        )
        .values(**values)
    )
    return values if changed.rowcount else None


async def recent(
    session: AsyncSession, *, limit: int, before: datetime | None = None
) -> Sequence[DeadLetter]:
    """The newest dead letters first (``before``: older than that)."""
    query = select(DeadLetter)
    if before is not None:
        query = query.where(DeadLetter.created_at < before)
    query = query.order_by(DeadLetter.created_at.desc(), DeadLetter.id.desc()).limit(limit)
    return (await session.scalars(query)).all()


async def delete_older(session: AsyncSession, *, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` dead letters made before ``before``; how many."""
    doomed = (
        await session.scalars(
            select(DeadLetter.id).where(DeadLetter.created_at < before).limit(limit)
        )
    ).all()
    if doomed:
        await session.execute(delete(DeadLetter).where(DeadLetter.id.in_(list(doomed))))
    return len(doomed)
