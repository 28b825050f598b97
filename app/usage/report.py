"""Usage grouped and priced over a range of whole UTC hours.

The rollups hold the sums of usage events per tenant, hour, kind, runtime, language and
function version; events not rolled up yet (the last second's) are read as well, and
added under the same keys, so a report is complete up to now and counts each event
once (``roll_up`` marks an event rolled in the transaction that adds it). A range is
widened to whole hours, the rollups' grain: ``start`` down, ``end`` up.

Each source row is priced on its own (an instance-hour's price depends on its backend)
and the costs are summed into the groups asked for. Time is split into its phases:
waiting in the queue, setting up, executing and tearing down; each group says what share
of its time each phase took, which is the question a training team asks of its bill
("how much of it was waiting?").
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, cast

from sqlalchemy import Table, case, false, func, literal, select, union_all
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Function, FunctionVersion, Tenant, UsageEvent, UsageRollup
from app.db.usage import COUNTS, DIMENSIONS, PLATFORM
from app.usage.prices import COST_PARTS, Prices

Group = Literal["tenant", "backend", "language", "function", "kind", "hour", "day"]
GROUPS: tuple[Group, ...] = ("tenant", "backend", "language", "function", "kind", "hour", "day")
PHASES = ("queue_ms", "setup_ms", "exec_ms", "teardown_ms")
QUANTITIES = (
    *(*PHASES, "cpu_ms", "instance_seconds", "memory_mb_seconds", "stored_gb_seconds"),
    *COUNTS,
)
#: The tenant column's value for the platform's own use (idle warm capacity).
PLATFORM_NAME = "(platform)"

_ROLLUPS = cast(Table, UsageRollup.__table__)
_EVENTS = cast(Table, UsageEvent.__table__)


def hour_floor(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def whole_hours(start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """``[start, end)`` widened to whole UTC hours."""
    first, last = hour_floor(start), hour_floor(end)
    return first, (last if last == end.astimezone(UTC) else last + timedelta(hours=1))


@dataclass(slots=True)
class Line:
    """One group's use and cost."""

    key: dict[str, str]
    events: int = 0
    failures: int = 0
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(QUANTITIES, 0.0))
    cost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COST_PARTS, 0.0))

    @property
    def total_cost(self) -> float:
        return sum(self.cost.values())

    def shares(self) -> dict[str, float]:
        """Each phase's share of the group's time (0 when it has none)."""
        total = sum(self.sums[p] for p in PHASES)
        return {p.removesuffix("_ms"): (self.sums[p] / total if total else 0.0) for p in PHASES}


@dataclass(frozen=True, slots=True)
class Source:
    """A rollup row or an event not rolled up yet: one priced unit."""

    tenant_id: str
    hour: datetime
    dims: dict[str, str]
    events: int
    failures: int
    sums: dict[str, float]


async def report(
    session: AsyncSession,
    *,
    start: datetime,
    end: datetime,
    group_by: Sequence[Group],
    prices: Prices,
    tenant_id: str | None,
) -> list[Line]:
    """Usage in ``[start, end)`` (whole hours) grouped by ``group_by``; only
    ``tenant_id``'s when given, everyone's and the platform's when None (the operator)."""
    first, last = whole_hours(start, end)
    sources = await _sources(session, first, last, tenant_id)
    names = await _names(session, sources, group_by)
    lines: dict[tuple[str, ...], Line] = {}
    for source in sources:
        key: dict[str, str] = {g: _value(g, source, names) for g in group_by}
        line = lines.setdefault(tuple(key.values()), Line(key))
        line.events += source.events
        line.failures += source.failures
        for name in QUANTITIES:
            line.sums[name] += source.sums[name]
        priced = prices.of(
            source.dims["runtime"],
            cpu_ms=source.sums["cpu_ms"],
            memory_mb_seconds=source.sums["memory_mb_seconds"],
            instance_seconds=source.sums["instance_seconds"],
            stored_gb_seconds=source.sums["stored_gb_seconds"],
            bytes_moved=int(source.sums["bytes_in"] + source.sums["bytes_out"]),
        )
        for part, amount in priced.items():
            line.cost[part] += amount
    return [lines[k] for k in sorted(lines)]


async def _sources(
    session: AsyncSession, first: datetime, last: datetime, tenant_id: str | None
) -> list[Source]:
    """The rollups and the events not rolled up yet, in one statement: one snapshot of
    both, so an event rolled up between two reads is neither missed nor counted twice
    (two statements see two snapshots, under SQLite's autocommit reads and PostgreSQL's
    read committed alike)."""
    rolled = select(
        _ROLLUPS.c.tenant_id,
        _ROLLUPS.c.hour.label("moment"),
        *(_ROLLUPS.c[d] for d in DIMENSIONS),
        _ROLLUPS.c.events,
        _ROLLUPS.c.failures,
        *(_ROLLUPS.c[q] for q in QUANTITIES),
    ).where(_ROLLUPS.c.hour >= first, _ROLLUPS.c.hour < last)
    pending = select(
        func.coalesce(_EVENTS.c.tenant_id, PLATFORM),
        _EVENTS.c.occurred_at,
        *(func.coalesce(_EVENTS.c[d], "") for d in DIMENSIONS),
        literal(1),
        case((_EVENTS.c.status.in_(("failed", "errored")), 1), else_=0),
        *(func.coalesce(_EVENTS.c[q], 0) for q in QUANTITIES),
    ).where(
        _EVENTS.c.rolled == false(), _EVENTS.c.occurred_at >= first, _EVENTS.c.occurred_at < last
    )
    if tenant_id is not None:
        rolled = rolled.where(_ROLLUPS.c.tenant_id == tenant_id)
        pending = pending.where(_EVENTS.c.tenant_id == tenant_id)
    rows = (await session.execute(union_all(rolled, pending))).all()
    return [
        Source(
            tenant_id=row[0] or PLATFORM,
            hour=hour_floor(_aware(_moment(row[1]))),
            dims={d: row[2 + i] or "" for i, d in enumerate(DIMENSIONS)},
            events=int(row[2 + len(DIMENSIONS)]),
            failures=int(row[3 + len(DIMENSIONS)]),
            sums={q: float(row[4 + len(DIMENSIONS) + i] or 0) for i, q in enumerate(QUANTITIES)},
        )
        for row in rows
    ]


def _moment(value: datetime | str) -> datetime:
    """A union's time column: SQLite gives the stored text back (the column type of a
    compound select is not applied to its rows), PostgreSQL a datetime."""
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


async def _names(
    session: AsyncSession, sources: Iterable[Source], group_by: Sequence[Group]
) -> dict[str, str]:
    """Display names of the tenants and function versions the groups show."""
    names: dict[str, str] = {PLATFORM: PLATFORM_NAME}
    if "tenant" in group_by:
        ids = {s.tenant_id for s in sources} - {PLATFORM}
        if ids:
            found = await session.execute(select(Tenant.id, Tenant.name).where(Tenant.id.in_(ids)))
            names.update({row.id: row.name for row in found})
    if "function" in group_by:
        ids = {s.dims["function_version_id"] for s in sources} - {""}
        if ids:
            found = await session.execute(
                select(FunctionVersion.id, FunctionVersion.version, Function.name)
                .join(Function, Function.id == FunctionVersion.function_id)
                .where(FunctionVersion.id.in_(ids))
            )
            names.update({row.id: f"{row.name}@{row.version}" for row in found})
    return names


def _value(group: Group, source: Source, names: dict[str, str]) -> str:
    match group:
        case "tenant":
            return names.get(source.tenant_id, source.tenant_id)
        case "backend":
            return source.dims["runtime"]
        case "language":
            return source.dims["language"]
        case "function":
            version = source.dims["function_version_id"]
            return names.get(version, version)
        case "kind":
            return source.dims["kind"]
        case "hour":
            return source.hour.isoformat()
        case "day":
            return source.hour.date().isoformat()


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def as_row(line: Line) -> dict[str, Any]:
    """A line as the API and the CSV give it: keys, use, cost and shares, flat."""
    sums = line.sums
    return {
        **line.key,
        "events": line.events,
        "failures": line.failures,
        "retries": int(sums["retries"]),
        "queue_s": sums["queue_ms"] / 1000.0,
        "setup_s": sums["setup_ms"] / 1000.0,
        "exec_s": sums["exec_ms"] / 1000.0,
        "teardown_s": sums["teardown_ms"] / 1000.0,
        "cpu_s": sums["cpu_ms"] / 1000.0,
        "memory_gb_s": sums["memory_mb_seconds"] / 1024.0,
        "instance_hours": sums["instance_seconds"] / 3600.0,
        "stored_gb_hours": sums["stored_gb_seconds"] / 3600.0,
        "bytes_in": int(sums["bytes_in"]),
        "bytes_out": int(sums["bytes_out"]),
        **{f"{phase}_share": share for phase, share in line.shares().items()},
        **{f"cost_{part}": amount for part, amount in line.cost.items()},
        "cost": line.total_cost,
    }


def total_of(groups: Sequence[str], lines: Iterable[Line]) -> Line:
    """Every line added up (its keys empty)."""
    total = Line(dict.fromkeys(groups, ""))
    for line in lines:
        total.events += line.events
        total.failures += line.failures
        for name, value in line.sums.items():
            total.sums[name] += value
        for part, amount in line.cost.items():
            total.cost[part] += amount
    return total


def as_csv(groups: Sequence[str], lines: Sequence[Line]) -> str:
    """The lines as CSV, one row each, then their total (first key ``total``)."""
    out = io.StringIO()
    rows = [as_row(line) for line in [*lines, total_of(groups, lines)]]
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for i, row in enumerate(rows):
        if i == len(rows) - 1:
            row = {**row, **dict.fromkeys(groups[:1], "total")}
        writer.writerow(row)
    return out.getvalue()
