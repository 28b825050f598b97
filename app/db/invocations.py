"""Invocations: queued by the gateway, claimed and finished by a node.

State machine: ``queued -> running -> succeeded | failed | errored``. A finished row is
never overwritten: ``finish`` only updates a row that is still queued or running, so a
late result from a node presumed dead cannot replace the one already stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar, cast

from sqlalchemy import Table, and_, bindparam, insert, literal_column, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import usage
from app.db.models import Invocation, utcnow
from app.db.writer import Batchable
from app.errors import NotFound, ValidationFailed
from runtimes.models import RunResult


class Status(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"  #: every stage exited 0
    FAILED = "failed"  #: the user's code failed (exit code, time or memory limit, ...)
    ERRORED = "errored"  #: the platform failed; see ``error``


OPEN = (Status.QUEUED, Status.RUNNING)
FINAL = (Status.SUCCEEDED, Status.FAILED, Status.ERRORED)


def status_of(result: RunResult) -> Status:
    if result.error is not None:
        return Status.ERRORED
    return Status.SUCCEEDED if result.succeeded else Status.FAILED


# The hot path's statements, built once: Core on the table (not ORM-enabled DML, whose
# per-call statement construction costs more than the database round trip), with bound
# parameters for everything that varies, run with ``executemany`` for a whole batch.
_T = cast(Table, Invocation.__table__)
_INSERT = insert(_T)
# (Literal statuses: an expanding IN parameter cannot be used with executemany.)
_OPEN_ROW = and_(
    _T.c.id == bindparam("b_id"),
    or_(*(_T.c.status == literal_column(f"'{s.value}'") for s in OPEN)),
)
_UPDATE_OPEN = update(_T).where(_OPEN_ROW)


async def _update_open(session: AsyncSession, params: list[dict[str, Any]]) -> int:
    """Run the open-row UPDATE once per parameter set; the number of rows it changed."""
    conn = await session.connection()
    result = await conn.execute(_UPDATE_OPEN, params[0] if len(params) == 1 else params)
    return int(result.rowcount)


async def _open_ids(session: AsyncSession, writes: Sequence[_Lifecycle]) -> set[str]:
    """Which rows of ``writes`` are still queued or running (locked on PostgreSQL).

    A lone write needs no look-up: its UPDATE's row count says whether the row was open.
    """
    ids = [w.invocation_id for w in writes]
    query = select(_T.c.id).where(_T.c.id.in_(set(ids)), _T.c.status.in_(list(OPEN)))
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update()
    return set((await session.execute(query)).scalars().all())


def _claim[W: _Lifecycle](writes: Sequence[W], open_ids: set[str]) -> list[W | None]:
    """Per write: itself if its row is open (the first write per row wins), else None."""
    claimed: list[W | None] = []
    for write in writes:
        if write.invocation_id in open_ids:
            open_ids.discard(write.invocation_id)
            claimed.append(write)
        else:
            claimed.append(None)
    return claimed


@dataclass(frozen=True, slots=True)
class _Lifecycle(Batchable):
    invocation_id: str


@dataclass(frozen=True, slots=True)
class Create(_Lifecycle):
    """Insert a queued invocation; the result is the row as inserted (detached)."""

    stage: ClassVar[int] = 0
    tenant_id: str
    kind: str
    runtime: str | None
    language: str | None
    request: dict[str, Any]
    function_version_id: str | None = None

    def values(self, now: datetime) -> dict[str, Any]:
        return {
            "id": self.invocation_id,
            "tenant_id": self.tenant_id,
            "kind": self.kind,
            "runtime": self.runtime,
            "language": self.language,
            "function_version_id": self.function_version_id,
            "status": Status.QUEUED.value,
            "request": self.request,
            "created_at": now,
            "queued_at": now,
            "attempts": 0,
            "stdout": "",
            "stderr": "",
            "stdout_truncated": False,
            "stderr_truncated": False,
        }

    @classmethod
    async def run_many(cls, session: AsyncSession, writes: Sequence[Create]) -> list[Any]:
        now = utcnow()
        rows = [w.values(now) for w in writes]
        conn = await session.connection()
        await conn.execute(_INSERT, rows[0] if len(rows) == 1 else rows)
        return [Invocation(**row) for row in rows]


@dataclass(frozen=True, slots=True)
class MarkRunning(_Lifecycle):
    """Claim a row for a node; the result is False when the row is final already."""

    stage: ClassVar[int] = 1
    node_id: str
    attempt: int
    started_at: datetime

    def params(self) -> dict[str, Any]:
        return {
            "b_id": self.invocation_id,
            "status": Status.RUNNING.value,
            "node_id": self.node_id,
            "attempts": self.attempt,
            "started_at": self.started_at,
        }

    @classmethod
    async def run_many(cls, session: AsyncSession, writes: Sequence[MarkRunning]) -> list[Any]:
        if len(writes) == 1:
            return [await _update_open(session, [writes[0].params()]) > 0]
        # Marking a row running leaves it open: every write for an open row succeeds, in
        # queue order (the last one's node and attempt stand), as one after the other would.
        open_ids = await _open_ids(session, writes)
        params = [w.params() for w in writes if w.invocation_id in open_ids]
        if params:
            await _update_open(session, params)
        return [w.invocation_id in open_ids for w in writes]


@dataclass(frozen=True, slots=True)
class Finish(_Lifecycle):
    """Store a node's result and its usage; the result is the Status, or None when the
    row was final already (a late result never replaces a stored one)."""

    stage: ClassVar[int] = 2
    tenant_id: str
    kind: str
    node_id: str
    attempt: int
    result: RunResult
    queue_ms: float
    started_at: datetime

    def params(self, now: datetime) -> dict[str, Any]:
        result, run = self.result, self.result.run
        stored = result.model_dump(mode="json")
        if stored.get("run"):
            stored["run"]["stdout"] = stored["run"]["stderr"] = ""
        exit_code = run.exit_code if run else (result.compile.exit_code if result.compile else None)
        return {
            "b_id": self.invocation_id,
            "status": status_of(result).value,
            "error": result.error,
            "node_id": self.node_id,
            "attempts": self.attempt,
            "exit_code": exit_code,
            "stdout": run.stdout if run else "",
            "stderr": run.stderr if run else "",
            "stdout_truncated": bool(run and run.stdout_truncated),
            "stderr_truncated": bool(run and run.stderr_truncated),
            "result": stored,
            "started_at": self.started_at,
            "finished_at": now,
            "peak_memory_kb": result.peak_memory_kb,
            **self.costs(),
        }

    def costs(self) -> dict[str, float | None]:
        return {
            "queue_ms": self.queue_ms,
            "setup_ms": self.result.setup_ms,
            "exec_ms": self.result.exec_ms,
            "teardown_ms": self.result.teardown_ms,
            "cpu_ms": self.result.cpu_ms,
        }

    @classmethod
    async def run_many(cls, session: AsyncSession, writes: Sequence[Finish]) -> list[Any]:
        now = utcnow()
        claimed: list[Finish | None]
        if len(writes) == 1:
            updated = await _update_open(session, [writes[0].params(now)])
            claimed = [writes[0] if updated else None]
            stored = [w for w in claimed if w is not None]
        else:
            claimed = _claim(writes, await _open_ids(session, writes))
            stored = [w for w in claimed if w is not None]
            if stored:
                await _update_open(session, [w.params(now) for w in stored])
        if stored:
            await usage.record_many(
                session,
                [
                    usage.Usage(
                        tenant_id=w.tenant_id,
                        kind=w.kind,
                        day=now.date(),
                        failed=status_of(w.result) is not Status.SUCCEEDED,
                        costs=w.costs(),
                    )
                    for w in stored
                ],
            )
        return [status_of(w.result) if w is not None else None for w in claimed]


@dataclass(frozen=True, slots=True)
class Fail(_Lifecycle):
    """Mark an open invocation errored (lost node, ...); the result is whether it was open."""

    stage: ClassVar[int] = 3
    tenant_id: str
    kind: str
    error: str
    node_id: str | None = None

    @classmethod
    async def run_many(cls, session: AsyncSession, writes: Sequence[Fail]) -> list[Any]:
        now = utcnow()
        claimed = _claim(writes, await _open_ids(session, writes))
        stored = [w for w in claimed if w is not None]
        if stored:
            conn = await session.connection()
            for w in stored:  # rare: no need for executemany
                values: dict[str, Any] = {
                    "b_id": w.invocation_id,
                    "status": Status.ERRORED.value,
                    "error": w.error,
                    "finished_at": now,
                }
                if w.node_id is not None:
                    values["node_id"] = w.node_id
                await conn.execute(_UPDATE_OPEN, values)
            await usage.record_many(
                session,
                [
                    usage.Usage(w.tenant_id, w.kind, now.date(), failed=True, costs={})
                    for w in stored
                ],
            )
        return [w is not None for w in claimed]


async def create(session: AsyncSession, **fields: Any) -> Invocation:
    """One ``Create`` outside the batch writer (tests, tools)."""
    (row,) = await Create.run_many(session, [Create(**fields)])
    return cast(Invocation, row)


async def get(session: AsyncSession, *, tenant_id: str, invocation_id: str) -> Invocation:
    row = await session.get(Invocation, invocation_id)
    if row is None or row.tenant_id != tenant_id:
        raise NotFound(f"no invocation {invocation_id!r}")
    return row


async def list_for_tenant(
    session: AsyncSession,
    *,
    tenant_id: str,
    limit: int,
    status: str | None = None,
    kind: str | None = None,
    language: str | None = None,
    before: datetime | None = None,
    after_row: tuple[datetime, str] | None = None,
) -> Sequence[Invocation]:
    """Newest first. ``after_row`` (a decoded cursor) continues after that row."""
    query = select(Invocation).where(Invocation.tenant_id == tenant_id)
    if status:
        query = query.where(Invocation.status == status)
    if kind:
        query = query.where(Invocation.kind == kind)
    if language:
        query = query.where(Invocation.language == language)
    if before:
        query = query.where(Invocation.created_at < before)
    if after_row:
        created, row_id = after_row
        query = query.where(
            or_(
                Invocation.created_at < created,
                and_(Invocation.created_at == created, Invocation.id < row_id),
            )
        )
    query = query.order_by(Invocation.created_at.desc(), Invocation.id.desc()).limit(limit)
    return (await session.scalars(query)).all()


def encode_cursor(row: Invocation) -> str:
    return f"{row.created_at.isoformat()}|{row.id}"


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    created, sep, row_id = cursor.partition("|")
    try:
        when = datetime.fromisoformat(created)
    except ValueError:
        when = None
    if not sep or not row_id or when is None or when.tzinfo is None:
        raise ValidationFailed("cursor is not one this API returned")
    return when, row_id
