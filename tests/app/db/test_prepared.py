"""The lifecycle's statements on SQLite's own cursor store exactly what
``Connection.execute`` stores, raise what it raises, and on that driver do not go
through it; the app's committer falls back to its thread on them as on any write."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import bindparam, create_engine, event, insert, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import create_async_engine

from app.db import invocations as inv
from app.db import outputs
from app.db.engine import sqlite_pragmas
from app.db.models import Base, Invocation
from app.db.outputs import INLINE_BYTES
from app.db.prepared import Prepared
from app.db.transactions import SQLiteTransactions, apply_batchables, transactions_for
from wire.execution import RunResult, StageResult, StageStatus

NOW = datetime(2026, 12, 2, 1, 2, 3, 456789, tzinfo=UTC)
T = Invocation.__table__


def create(n: int, **request: Any) -> inv.Create:
    return inv.Create(
        invocation_id=f"i{n}",
        tenant_id="t1",
        kind="run",
        runtime="nsjail",
        language="python",
        request={"code": "print(1)", **request},
        claim=f"c{n}",
        job='{"job": 1}',
    )


def result(stdout: str = "1\n", **run: Any) -> RunResult:
    return RunResult(
        run=StageResult(
            status=StageStatus.FINISHED, exit_code=0, stdout=stdout, wall_ms=1.5, **run
        ),
        files={"out.txt": "aGk="},
        setup_ms=0.2,
        exec_ms=1.5,
        teardown_ms=0.1,
        cpu_ms=1.25,
        peak_memory_kb=2048,
    )


def finish(n: int, claim: str | None = None, **kwargs: Any) -> inv.Finish:
    return inv.Finish(
        invocation_id=f"i{n}",
        claim=claim or f"c{n}",
        attempt=1,
        node_id="node-1",
        started_at=NOW,
        finished_at=NOW,
        queue_ms=0.5,
        result=result(**kwargs),
    )


def running(n: int) -> inv.MarkRunning:
    return inv.MarkRunning(invocation_id=f"i{n}", claim=f"c{n}", node_id="node-1", started_at=NOW)


#: batches as the writer makes them: lone writes, and many of a kind in one statement
BATCHES: list[list[Any]] = [
    [create(1)],
    [running(1)],
    [finish(1)],
    [create(2), create(3, code="x" * (INLINE_BYTES + 10)), create(4)],  # one with a blob
    [running(2), running(3)],
    [finish(2, stdout="y" * (INLINE_BYTES + 5), stdout_truncated=True), finish(3)],
    [finish(4, claim="stale")],  # not the current claim: nothing stored
    [inv.Fail(invocation_id="i4", claim="c4", error="lost\x00")],
    [finish(1)],  # final already: nothing stored
]


def stored(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(path) as db:
        return {
            table: db.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
            for table in ("invocations", "usage_events", "blobs")
        }


def schema(path: Path) -> None:
    """The tables and a tenant, in WAL mode as the app's database is."""
    engine = create_engine(f"sqlite:///{path}")
    event.listen(engine, "connect", sqlite_pragmas)
    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO tenants (id, name, disabled, created_at, updated_at) "
            "VALUES ('t1', 't1', 0, '2026-12-01 00:00:00', '2026-12-01 00:00:00')"
        )
    engine.dispose()


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inv, "utcnow", lambda: NOW)


class BlobIds:
    """Blob ids in a sequence started again for each side (they are random)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        monkeypatch.setattr(outputs, "new_id", self.new_id)

    def new_id(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}_{self.n:020d}"


async def test_the_same_rows_as_connection_execute(
    tmp_path: Path, executed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared, core = tmp_path / "prepared.db", tmp_path / "core.db"
    schema(prepared)
    schema(core)
    outcomes: dict[str, list[Any]] = {"prepared": [], "core": []}
    ids = BlobIds(monkeypatch)

    engine = create_engine(f"sqlite:///{prepared}")  # sqlite3: the prepared path
    executed.clear()  # the schema's own statements
    for batch in BATCHES:
        with engine.begin() as conn:
            outcomes["prepared"].append(apply_batchables(conn, batch))
    engine.dispose()
    through_execute = list(executed)

    ids.n = 0
    async_engine = create_async_engine(f"sqlite+aiosqlite:///{core}")  # Connection.execute
    for batch in BATCHES:
        async with async_engine.begin() as conn:
            outcomes["core"].append(await conn.run_sync(apply_batchables, batch))
    await async_engine.dispose()

    assert stored(prepared) == stored(core)
    rows = stored(prepared)
    assert len(rows["invocations"]) == 4 and len(rows["usage_events"]) == 4
    assert len(rows["blobs"]) == 2  # the large code and the large stdout

    def plain(value: Any) -> Any:
        if isinstance(value, Invocation):
            return {k: v for k, v in vars(value).items() if k != "_sa_instance_state"}
        return value

    def comparable(outcome: list[Any]) -> list[Any]:
        return [[plain(r) for r in batch] for batch in outcome]

    assert comparable(outcomes["prepared"]) == comparable(outcomes["core"])
    assert outcomes["prepared"][6] == [None] and outcomes["prepared"][8] == [None]
    # every lone write's statements ran on the cursor, and a batch's look-up of its
    # current claims and its usage events too; through execute() went only the rare
    # ones: the large code's blob and the large stdout's blob
    assert through_execute == ["INSERT", "INSERT"]


def test_a_left_out_required_parameter_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    schema(path)
    statement = Prepared(update(T).where(T.c.id == bindparam("b_id")))
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as conn, pytest.raises(KeyError):
        statement.execute(conn, [{"status": "queued"}])  # no b_id
    engine.dispose()


def test_a_column_default_that_is_not_a_constant_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    schema(path)
    tenants = Base.metadata.tables["tenants"]  # created_at defaults to a function
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as conn, pytest.raises(TypeError, match="constant defaults"):
        Prepared(insert(tenants)).execute(conn, [{"id": "t2", "name": "t2"}])
    engine.dispose()


def test_the_drivers_errors_are_sqlalchemys(tmp_path: Path) -> None:
    """What ``execute()`` would raise: a duplicate row is an ``IntegrityError``, a held
    write lock an ``OperationalError`` whose ``orig`` says SQLITE_BUSY."""
    path = tmp_path / "p.db"
    schema(path)
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    with engine.begin() as conn:
        apply_batchables(conn, [create(1)])
    with engine.begin() as conn, pytest.raises(IntegrityError):
        apply_batchables(conn, [create(1)])
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with engine.begin() as conn, pytest.raises(OperationalError) as raised:
            apply_batchables(conn, [create(2)])
        assert raised.value.orig.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY  # type: ignore[union-attr]
    finally:
        holder.close()
        engine.dispose()


async def test_a_lifecycle_write_that_finds_the_lock_held_waits_in_the_thread(
    tmp_path: Path,
) -> None:
    """The app's committer on a real lifecycle write: on the loop its statements run on
    the cursor; with the write lock held elsewhere it goes to the thread, not fails."""
    path = tmp_path / "p.db"
    schema(path)
    transactions = transactions_for(f"sqlite+aiosqlite:///{path}", cast(Any, None))
    assert isinstance(transactions, SQLiteTransactions)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        pending = asyncio.ensure_future(transactions.run([create(1)]))
        await asyncio.sleep(0.3)
        assert not pending.done()
        holder.execute("COMMIT")
        [row] = await asyncio.wait_for(pending, 10)
        assert row.id == "i1"
        assert await transactions.run([running(1)]) == [True]  # the lock free: on the loop
    finally:
        holder.close()
        await transactions.close()
    assert transactions.counters() == {"loop_commits": 1.0, "lock_busy": 1.0, "read_busy": 0.0}
    assert stored(path)["invocations"][0][0] == "i1"
