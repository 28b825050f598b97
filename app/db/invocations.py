"""Invocations: created by a gateway, handed out under claim tokens, stored by a recorder.

State machine: ``queued -> running -> succeeded | failed | errored``, with
``running -> queued`` when the reconciler hands a lost execution out again. Every write
after ``Create`` names the claim token it acts for and changes the row only while it is
open **and** that token is current, so a node presumed dead, a duplicate delivery or a
late result can never replace what the current hand-out stored; a row that is final is
never written again. ``attempts`` counts the tokens issued: an execution that ran more
than once always says so.

The lifecycle writes are ``Batchable`` (see ``app.db.transactions``): prebuilt Core
statements with bound parameters, run with ``executemany`` for a whole batch, on a
synchronous connection (SQLite's own, on the event loop or in its writer thread, or
``run_sync`` of an async one). ``Finish`` and ``Fail`` append the row's usage event in the
same transaction (``app.db.usage``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar, cast

from sqlalchemy import (
    Connection,
    Table,
    and_,
    bindparam,
    delete,
    insert,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import blobs, outputs, usage
from app.db.cursors import older_than
from app.db.models import Invocation, utcnow
from app.db.outputs import BlobPart
from app.db.prepared import Prepared
from app.db.transactions import Batchable
from app.errors import NotFound
from wire.execution import RunResult


class Status(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"  #: every stage exited 0
    FAILED = "failed"  #: the user's code failed (exit code, time or memory limit, ...)
    ERRORED = "errored"  #: the platform failed; see ``error``


OPEN = (Status.QUEUED, Status.RUNNING)
FINAL = (Status.SUCCEEDED, Status.FAILED, Status.ERRORED)

#: What a write that stored something returns: the columns it set, as stored.
Stored = dict[str, Any]
#: Where ``values`` puts the blobs of a final write's large parts (not a column).
BLOB_PARTS = "__blobs__"


@dataclass(slots=True)
class InvocationRow:
    """An invocation's row as this gateway inserted it (``Create``), then given the columns
    its final write stored (``app.invocations.service``): a plain record of the same
    columns as ``Invocation``, so that the hot path answers without an ORM instance,
    whose instrumented construction and attribute writes cost 26 µs per call
    (docs/benchmarks-history.md, "Issue 10, 2026-12-03: the gateway's row record and route
    table, the login shell, the compiled Python driver"). A row read from the database is
    an ``Invocation``."""

    id: str
    tenant_id: str
    kind: str
    status: str
    created_at: datetime
    runtime: str | None = None
    language: str | None = None
    function_version_id: str | None = None
    error: str | None = None
    node_id: str | None = None
    attempts: int = 0
    claim: str | None = None
    job: str | None = None
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    request: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] | None = None
    queued_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    queue_ms: float | None = None
    setup_ms: float | None = None
    exec_ms: float | None = None
    teardown_ms: float | None = None
    cpu_ms: float | None = None
    peak_memory_kb: int | None = None
    bytes_in: int | None = None
    bytes_out: int | None = None


#: A stored invocation, as written here (``InvocationRow``) or as read (``Invocation``).
StoredInvocation = Invocation | InvocationRow


def status_of(result: RunResult) -> Status:
    return Status(result.outcome)


# The hot path's statements, built once: Core on the table (not ORM-enabled DML, whose
# per-call statement construction costs more than the database round trip), with bound
# parameters for everything that varies. (Literal statuses: an expanding IN parameter
# cannot be used with executemany.)
# (On SQLite's own driver they run on its cursor: ``app.db.prepared``.)
_T = cast(Table, Invocation.__table__)
_INSERT = Prepared(insert(_T))
_IS_OPEN = or_(*(_T.c.status == literal_column(f"'{s.value}'") for s in OPEN))
_CURRENT = and_(_T.c.id == bindparam("b_id"), _T.c.claim == bindparam("b_claim"), _IS_OPEN)
_UPDATE_CURRENT = Prepared(update(_T).where(_CURRENT))
#: ``_current``'s look-up on SQLite's cursor, for a number of ids (``{marks}``)
_CURRENT_SQL = (
    f"SELECT id, claim FROM {_T.name} WHERE id IN ({{marks}}) AND status IN "
    f"({', '.join(repr(s.value) for s in OPEN)})"
)


def bytes_out(result: RunResult) -> int:
    """What a call gave back: its stages' output (UTF-8) and its fetched files (decoded)."""
    size = 0
    for stage in (result.compile, result.run):
        if stage is not None:
            size += len(stage.stdout.encode()) + len(stage.stderr.encode())
    for encoded in result.files.values():
        size += len(encoded) * 3 // 4 - encoded[-2:].count("=")
    return size


def epoch(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _update_current(conn: Connection, params: list[dict[str, Any]]) -> int:
    """Run the current-claim UPDATE once per parameter set; rows changed (one set only)."""
    return _UPDATE_CURRENT.execute(conn, params)


def _current(conn: Connection, writes: Sequence[_Lifecycle]) -> set[tuple[str, str]]:
    """The (id, claim) pairs of ``writes`` whose row is open under that claim (locked on
    PostgreSQL). A lone write needs no look-up: its UPDATE's row count says it."""
    ids = list({w.invocation_id for w in writes})
    if Prepared.on_cursor(conn):  # SQLite's own cursor: no statement built per batch
        marks = ",".join("?" * len(ids))
        return set(Prepared.query(conn, _CURRENT_SQL.format(marks=marks), ids))
    query = select(_T.c.id, _T.c.claim).where(_T.c.id.in_(ids), _T.c.status.in_(list(OPEN)))
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    return {(row.id, row.claim) for row in conn.execute(query)}


def _claimed[W: _Lifecycle](writes: Sequence[W], current: set[tuple[str, str]]) -> list[W | None]:
    """Per write: itself if its row is open under its claim (the first such write per row
    wins), else None."""
    claimed: list[W | None] = []
    for write in writes:
        key = (write.invocation_id, write.claim)
        if key in current:
            current.discard(key)
            claimed.append(write)
        else:
            claimed.append(None)
    return claimed


def _apply_final[W: _Final](conn: Connection, writes: Sequence[W]) -> list[Stored | None]:
    """Store final writes whose claim is current, with their blobs; append their usage
    events."""
    now = utcnow()
    parts: dict[str, list[BlobPart]] = {}

    def values_of(write: W) -> Stored:
        values = write.values(now)
        parts[write.invocation_id] = values.pop(BLOB_PARTS, [])
        return values

    if len(writes) == 1:
        values = values_of(writes[0])
        stored = [values if _update_current(conn, [_params(writes[0], values)]) else None]
    else:
        claimed = _claimed(writes, _current(conn, writes))
        stored = [values_of(w) if w is not None else None for w in claimed]
        params = [_params(w, v) for w, v in zip(writes, stored, strict=True) if v is not None]
        if params:
            _update_current(conn, params)
    ids = [w.invocation_id for w, v in zip(writes, stored, strict=True) if v is not None]
    if ids:
        usage.record_invocations(conn, ids)
        expiring = [w for w in writes if w.invocation_id in ids and parts.get(w.invocation_id)]
        for write in expiring:  # rare (large outputs): a statement per invocation
            blobs.insert(
                conn,
                [(write.invocation_id, part) for part in parts[write.invocation_id]],
                now=now,
            )
    return stored


def _params(write: _Lifecycle, values: Stored) -> dict[str, Any]:
    return {"b_id": write.invocation_id, "b_claim": write.claim, **values}


@dataclass(frozen=True, slots=True)
class _Lifecycle(Batchable):
    invocation_id: str
    claim: str


@dataclass(frozen=True, slots=True)
class Create(Batchable):
    """Insert a queued invocation with its dispatch intent (the Job, as JSON) and its first
    claim token; the result is the row as inserted (detached)."""

    stage: ClassVar[int] = 0
    invocation_id: str
    tenant_id: str
    kind: str
    runtime: str | None
    language: str | None
    request: dict[str, Any]
    claim: str
    job: str
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
            "attempts": 1,
            "claim": self.claim,
            "job": self.job,
            "stdout": "",
            "stderr": "",
            "stdout_truncated": False,
            "stderr_truncated": False,
            "bytes_in": len(self.job.encode()),  # what goes to the node: code, stdin, files
        }

    @classmethod
    def run_many(cls, conn: Connection, writes: Sequence[Create]) -> list[Any]:
        now = utcnow()
        rows: list[dict[str, Any]] = []
        parts: list[tuple[str, BlobPart]] = []
        for write in writes:
            row = write.values(now)
            row["request"], large = outputs.split_request(write.request)
            rows.append(row)
            parts += [(write.invocation_id, part) for part in large]
        _INSERT.execute(conn, rows)
        if parts:  # rare: a request with large code or stdin
            blobs.insert(conn, parts, now=now)
        return [InvocationRow(**row) for row in rows]


@dataclass(frozen=True, slots=True)
class EnsureCreated:
    """``create`` again after a connection was lost while it was being committed: its
    outcome is unknown (the commit may have been made durable before the answer was lost),
    so the row is inserted only if it is not there. Only the gateway that made the id
    writes it, so nothing else can insert it between the read and the insert."""

    create: Create

    async def __call__(self, session: AsyncSession) -> InvocationRow:
        found = await session.scalar(select(_T.c.id).where(_T.c.id == self.create.invocation_id))
        if found is None:
            conn = await session.connection()
            return (await conn.run_sync(Create.run_many, [self.create]))[0]  # type: ignore[no-any-return]
        return InvocationRow(**self.create.values(utcnow()))


@dataclass(frozen=True, slots=True)
class MarkRunning(_Lifecycle):
    """A node claimed the execution; the result is whether the row took it (open, current)."""

    stage: ClassVar[int] = 1
    node_id: str
    started_at: datetime

    def params(self) -> dict[str, Any]:
        return {
            "b_id": self.invocation_id,
            "b_claim": self.claim,
            "status": Status.RUNNING.value,
            "node_id": self.node_id,
            "started_at": self.started_at,
        }

    @classmethod
    def run_many(cls, conn: Connection, writes: Sequence[MarkRunning]) -> list[Any]:
        if len(writes) == 1:
            return [_update_current(conn, [writes[0].params()]) > 0]
        current = _current(conn, writes)
        taken = [(w.invocation_id, w.claim) in current for w in writes]
        params = [w.params() for w, ok in zip(writes, taken, strict=True) if ok]
        if params:
            _update_current(conn, params)
        return taken


@dataclass(frozen=True, slots=True)
class _Final(_Lifecycle):
    """A write that ends the row (and appends its usage event). ``values`` may carry the
    blobs of its large parts under ``BLOB_PARTS``; they are stored with the row."""

    def values(self, now: datetime) -> Stored:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Finish(_Final):
    """Store a node's result under its claim: the stored columns, or None when the claim
    is not current or the row is final (a late or duplicate result changes nothing)."""

    stage: ClassVar[int] = 2
    attempt: int
    node_id: str
    started_at: datetime
    finished_at: datetime
    queue_ms: float
    result: RunResult

    def values(self, now: datetime) -> Stored:
        result, run = self.result, self.result.run
        split = outputs.split_result(result)
        exit_code = run.exit_code if run else (result.compile.exit_code if result.compile else None)
        return {
            "status": status_of(result).value,
            "error": _text_column(result.error),
            "attempts": self.attempt,
            "node_id": self.node_id,
            "exit_code": exit_code,
            "stdout": split.stdout,
            "stderr": split.stderr,
            "stdout_truncated": bool(run and run.stdout_truncated),
            "stderr_truncated": bool(run and run.stderr_truncated),
            "result": split.result,
            "job": None,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "queue_ms": self.queue_ms,
            "setup_ms": result.setup_ms,
            "exec_ms": result.exec_ms,
            "teardown_ms": result.teardown_ms,
            "cpu_ms": result.cpu_ms,
            "peak_memory_kb": result.peak_memory_kb,
            "bytes_out": bytes_out(result),
            BLOB_PARTS: split.blobs,
        }

    @classmethod
    def run_many(cls, conn: Connection, writes: Sequence[Finish]) -> list[Any]:
        return _apply_final(conn, writes)


@dataclass(frozen=True, slots=True)
class Fail(_Final):
    """End an open invocation as ``errored`` under its claim (lost, never taken): the
    stored columns, or None when the claim is not current or the row is final."""

    stage: ClassVar[int] = 3
    error: str

    def values(self, now: datetime) -> Stored:
        return {
            "status": Status.ERRORED.value,
            "error": _text_column(self.error),
            "job": None,
            "finished_at": now,
        }

    @classmethod
    def run_many(cls, conn: Connection, writes: Sequence[Fail]) -> list[Any]:
        return _apply_final(conn, writes)


@dataclass(frozen=True, slots=True)
class Reissue(_Lifecycle):
    """Hand an open invocation out again: a new claim token, one more attempt, queued.
    The result is whether the row took it (it was open under ``claim``)."""

    stage: ClassVar[int] = 4
    new_claim: str

    @classmethod
    def run_many(cls, conn: Connection, writes: Sequence[Reissue]) -> list[Any]:
        taken = []
        for w in writes:  # rare (lost hand-outs): one statement each is fine
            result = conn.execute(
                update(_T)
                .where(_CURRENT)
                .values(
                    claim=w.new_claim,
                    attempts=_T.c.attempts + 1,
                    status=Status.QUEUED.value,
                    node_id=None,
                    started_at=None,
                ),
                {"b_id": w.invocation_id, "b_claim": w.claim},
            )
            taken.append(result.rowcount > 0)
        return taken


@dataclass(frozen=True, slots=True)
class OpenRow:
    """What the reconciler reads of an open invocation."""

    id: str
    tenant_id: str
    status: str
    claim: str
    attempts: int
    created_at: datetime
    node_id: str | None
    started_at: datetime | None


async def open_rows(session: AsyncSession, *, before: datetime, limit: int) -> list[OpenRow]:
    """Open invocations created before ``before``, oldest first."""
    query = (
        select(
            _T.c.id,
            _T.c.tenant_id,
            _T.c.status,
            _T.c.claim,
            _T.c.attempts,
            _T.c.created_at,
            _T.c.node_id,
            _T.c.started_at,
        )
        .where(_T.c.status.in_(list(OPEN)), _T.c.created_at < before)
        .order_by(_T.c.created_at)
        .limit(limit)
    )
    rows = (await session.execute(query)).all()
    return [
        OpenRow(
            id=r.id,
            tenant_id=r.tenant_id,
            status=r.status,
            claim=r.claim or "",
            attempts=r.attempts,
            created_at=_aware(r.created_at),
            node_id=r.node_id,
            started_at=_aware(r.started_at) if r.started_at is not None else None,
        )
        for r in rows
    ]


async def jobs_of(session: AsyncSession, ids: Sequence[str]) -> dict[str, str]:
    """The dispatch intents (Job JSON) of open invocations."""
    if not ids:
        return {}
    query = select(_T.c.id, _T.c.job).where(_T.c.id.in_(list(ids)), _T.c.job.is_not(None))
    return {row.id: row.job for row in await session.execute(query)}


async def delete_finished(session: AsyncSession, *, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` final invocations created before ``before``, with their
    blobs (an open one is the reconciler's); how many."""
    doomed = (
        await session.scalars(
            select(_T.c.id)
            .where(_T.c.created_at < before, _T.c.status.in_(list(FINAL)))
            .order_by(_T.c.created_at)
            .limit(limit)
        )
    ).all()
    if not doomed:
        return 0
    await blobs.delete_of(session, doomed)
    await session.execute(delete(_T).where(_T.c.id.in_(list(doomed))))
    return len(doomed)


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


async def get(session: AsyncSession, *, tenant_id: str | None, invocation_id: str) -> Invocation:
    """The invocation, if it is ``tenant_id``'s (None: the operator, anyone's)."""
    row = await session.get(Invocation, invocation_id)
    if row is None or (tenant_id is not None and row.tenant_id != tenant_id):
        raise NotFound(f"no invocation {invocation_id!r}")
    return row


async def list_for_tenant(
    session: AsyncSession,
    *,
    tenant_id: str | None,
    limit: int,
    status: str | None = None,
    kind: str | None = None,
    language: str | None = None,
    function_version_id: str | None = None,
    before: datetime | None = None,
    after_row: tuple[datetime, str] | None = None,
) -> Sequence[Invocation]:
    """Newest first; ``tenant_id``'s (None: the operator, everyone's). ``after_row`` (a
    decoded cursor) continues after that row."""
    query = select(Invocation)
    if tenant_id is not None:
        query = query.where(Invocation.tenant_id == tenant_id)
    if function_version_id:
        query = query.where(Invocation.function_version_id == function_version_id)
    if status:
        query = query.where(Invocation.status == status)
    if kind:
        query = query.where(Invocation.kind == kind)
    if language:
        query = query.where(Invocation.language == language)
    if before:
        query = query.where(Invocation.created_at < before)
    if after_row:
        query = query.where(older_than(Invocation.created_at, Invocation.id, after_row))
    query = query.order_by(Invocation.created_at.desc(), Invocation.id.desc()).limit(limit)
    return (await session.scalars(query)).all()


def _text_column(text: str | None) -> str | None:
    """``text`` for a text column: a NUL (a platform message quoting output) becomes U+FFFD."""
    return text.replace("\x00", "\ufffd") if text else text
