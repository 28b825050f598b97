"""The overview over time: executions, errors and latency (p50, p99) per interval over
the last hour or day, from the invocations table.

Two reads, each bounded by the window on an indexed column (``created_at``; with a
tenant, ``(tenant_id, created_at)``): the counts per interval and status are added up by
the database (``GROUP BY``, nothing but the sums leaves it), and the latencies (created
to finished) of at most ``SAMPLE`` of the newest finished rows are read for the
percentiles; an interval older than the sample shows none, and the answer says the
sample was cut (``sampled``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, Integer, cast, func, literal, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Invocation

#: rows read for the percentiles at most
SAMPLE = 20_000
#: statuses counted as errors of the platform, and failures of the code
ERRORED, FAILED = "errored", "failed"


@dataclass(frozen=True)
class Span:
    name: str
    step: timedelta
    steps: int


SPANS = {
    "hour": Span("hour", timedelta(minutes=1), 60),
    "day": Span("day", timedelta(minutes=15), 96),
}


def window(span: Span, now: datetime) -> tuple[datetime, datetime]:
    """The intervals' start and end: whole steps, the last one holding ``now``."""
    step_s = int(span.step.total_seconds())
    end_s = (int(now.timestamp()) // step_s + 1) * step_s
    end = datetime.fromtimestamp(end_s, tz=now.tzinfo)
    return end - span.step * span.steps, end


def _epoch(column: Any, dialect: str) -> ColumnElement[int]:
    """Seconds since the epoch of a stored time, in SQL."""
    if dialect == "sqlite":
        return cast(func.strftime("%s", column), Integer)
    return cast(func.floor(func.extract("epoch", column)), BigInteger)


async def series(
    session: AsyncSession, *, tenant_id: str | None, span: Span, now: datetime
) -> dict[str, Any]:
    """Per interval of ``span`` up to ``now``: executions, errored, failed, p50 and p99
    latency (ms; None where nothing finished); ``tenant_id``'s only (None: everyone's)."""
    start, end = window(span, now)
    step_s = int(span.step.total_seconds())
    dialect = session.get_bind().dialect.name
    slot = (_epoch(Invocation.created_at, dialect) - literal(int(start.timestamp()))) // step_s
    bounded = [Invocation.created_at >= start, Invocation.created_at < end]
    if tenant_id is not None:
        bounded.append(Invocation.tenant_id == tenant_id)
    counted = (
        select(slot.label("slot"), Invocation.status, func.count().label("n"))
        .where(*bounded)
        .group_by(slot, Invocation.status)
    )
    executions = [0] * span.steps
    errored = [0] * span.steps
    failed = [0] * span.steps
    for index, status, n in (await session.execute(counted)).all():
        index = int(index)
        if not 0 <= index < span.steps:
            continue
        executions[index] += n
        if status == ERRORED:
            errored[index] += n
        elif status == FAILED:
            failed[index] += n
    timed = (
        select(Invocation.created_at, Invocation.finished_at)
        .where(*bounded, Invocation.finished_at.is_not(None))
        .order_by(Invocation.created_at.desc())
        .limit(SAMPLE)
    )
    rows = (await session.execute(timed)).all()
    latencies: list[list[float]] = [[] for _ in range(span.steps)]
    for created, finished in rows:
        if finished is None:
            continue  # excluded by the query; for the type checker
        index = int((created - start).total_seconds() // step_s)
        if 0 <= index < span.steps:
            latencies[index].append((finished - created).total_seconds() * 1000)
    for values in latencies:
        values.sort()
    return {
        "span": span.name,
        "step_s": step_s,
        "start": start.isoformat(),
        "labels": [(start + span.step * i).strftime("%H:%M") for i in range(span.steps)],
        "executions": executions,
        "errored": errored,
        "failed": failed,
        "p50_ms": [rank(values, 0.50) for values in latencies],
        "p99_ms": [rank(values, 0.99) for values in latencies],
        "sampled": len(rows) == SAMPLE,
    }


def rank(ordered: list[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted values."""
    if not ordered:
        return None
    index = max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 1)) - 1))
    return round(ordered[index], 1)
