"""Invocations: queued by the gateway, claimed and finished by a node.

State machine: ``queued -> running -> succeeded | failed | errored``. A finished row is
never overwritten: ``finish`` only updates a row that is still queued or running, so a
late result from a node presumed dead cannot replace the one already stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any, cast

from sqlalchemy import Table, and_, bindparam, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import usage
from app.db.models import Invocation, utcnow
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
# parameters for everything that varies.
_T = cast(Table, Invocation.__table__)
_INSERT = insert(_T)
_OPEN_ROW = and_(_T.c.id == bindparam("b_id"), _T.c.status.in_([s.value for s in OPEN]))
_RUNNING = update(_T).where(_OPEN_ROW)
_FINISH = update(_T).where(_OPEN_ROW)


async def create(
    session: AsyncSession,
    *,
    invocation_id: str,
    tenant_id: str,
    kind: str,
    runtime: str | None,
    language: str | None,
    request: dict[str, Any],
    function_version_id: str | None = None,
) -> Invocation:
    """Insert a queued invocation; returns the row as inserted (not attached to a session)."""
    now = utcnow()
    values: dict[str, Any] = {
        "id": invocation_id,
        "tenant_id": tenant_id,
        "kind": kind,
        "runtime": runtime,
        "language": language,
        "function_version_id": function_version_id,
        "status": Status.QUEUED.value,
        "request": request,
        "created_at": now,
        "queued_at": now,
        "attempts": 0,
        "stdout": "",
        "stderr": "",
        "stdout_truncated": False,
        "stderr_truncated": False,
    }
    conn = await session.connection()
    await conn.execute(_INSERT, values)
    return Invocation(**values)


async def mark_running(
    session: AsyncSession, *, invocation_id: str, node_id: str, attempt: int, started_at: datetime
) -> bool:
    """Claim the row for ``node_id``; False when it is already final."""
    conn = await session.connection()
    result = await conn.execute(
        _RUNNING,
        {
            "b_id": invocation_id,
            "status": Status.RUNNING.value,
            "node_id": node_id,
            "attempts": attempt,
            "started_at": started_at,
        },
    )
    return bool(result.rowcount)


async def finish(
    session: AsyncSession,
    *,
    invocation_id: str,
    tenant_id: str,
    kind: str,
    node_id: str,
    attempt: int,
    result: RunResult,
    queue_ms: float,
    started_at: datetime,
) -> Status | None:
    """Store a node's result and account for it; None when the row was final already."""
    now = utcnow()
    status = status_of(result)
    run = result.run
    stored = result.model_dump(mode="json")
    if stored.get("run"):
        stored["run"]["stdout"] = stored["run"]["stderr"] = ""
    exit_code = run.exit_code if run else (result.compile.exit_code if result.compile else None)
    costs = {
        "queue_ms": queue_ms,
        "setup_ms": result.setup_ms,
        "exec_ms": result.exec_ms,
        "teardown_ms": result.teardown_ms,
        "cpu_ms": result.cpu_ms,
    }
    conn = await session.connection()
    updated = await conn.execute(
        _FINISH,
        {
            "b_id": invocation_id,
            "status": status.value,
            "error": result.error,
            "node_id": node_id,
            "attempts": attempt,
            "exit_code": exit_code,
            "stdout": run.stdout if run else "",
            "stderr": run.stderr if run else "",
            "stdout_truncated": bool(run and run.stdout_truncated),
            "stderr_truncated": bool(run and run.stderr_truncated),
            "result": stored,
            "started_at": started_at,
            "finished_at": now,
            "peak_memory_kb": result.peak_memory_kb,
            **costs,
        },
    )
    if not updated.rowcount:
        return None
    await usage.record(
        session,
        tenant_id=tenant_id,
        kind=kind,
        day=now.date(),
        failed=status is not Status.SUCCEEDED,
        costs=costs,
    )
    return status


async def fail(
    session: AsyncSession,
    *,
    invocation_id: str,
    tenant_id: str,
    kind: str,
    error: str,
    node_id: str | None = None,
) -> bool:
    """Mark an open invocation errored (lost node, refused by every node, ...)."""
    now = utcnow()
    values: dict[str, Any] = {"status": Status.ERRORED, "error": error, "finished_at": now}
    if node_id is not None:
        values["node_id"] = node_id
    updated = await session.execute(
        update(Invocation)
        .where(Invocation.id == invocation_id, Invocation.status.in_(OPEN))
        .execution_options(synchronize_session=False)
        .values(**values)
    )
    if not updated.rowcount:  # type: ignore[attr-defined]
        return False
    await usage.record(
        session, tenant_id=tenant_id, kind=kind, day=now.date(), failed=True, costs={}
    )
    return True


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
