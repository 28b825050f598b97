"""What a create and a destroy cost the gateway's database (both stacks): a create is one
read (the tenant's totals, judged before any node is asked) and one commit (the totals'
conditional update and the row's insert); a destroy's answer is one read and one commit
(the row marked stopping), its teardown off the caller's path. Counted by statements and
commits on every engine made within the call, and reads made on the driver's cursor
(``app.db.prepared``), not the leader's jobs running meanwhile, nor the teardown it
leaves behind, so a change that adds a round trip fails here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any

import pytest
from sqlalchemy import Engine, event
from starlette.testclient import TestClient

from app.db.prepared import Prepared
from app.schemas.sandboxes import CreateSandbox
from tests.app.api.v1.test_sandboxes import create
from tests.app.sandboxes.conftest import run, services_of
from tests.app.sandboxes.test_quotas import principal

#: set in the counted call's context (its tasks inherit it, SQLAlchemy's shielded
#: commit task among them) and switched off when the call returns: a task it started
#: that runs on afterwards (the teardown) is not counted
_COUNTING: ContextVar[list[bool] | None] = ContextVar("counting", default=None)


class Counted:
    def __init__(self) -> None:
        self.reads: list[str] = []
        self.writes: list[str] = []
        self.commits = 0

    async def call[T](self, work: Callable[[], Awaitable[T]]) -> T:
        """``work``, its statements and commits counted."""
        self.reads, self.writes, self.commits = [], [], 0
        on = [True]
        token = _COUNTING.set(on)
        try:
            return await work()
        finally:
            on[0] = False
            _COUNTING.reset(token)


def _ours() -> bool:
    on = _COUNTING.get()
    return on is not None and on[0]


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counted]:
    seen = Counted()
    query = Prepared.query

    def prepared_query(conn: Any, sql: str, params: Any) -> list[Any]:
        if _ours():  # a read on the driver's cursor, past SQLAlchemy's events
            seen.reads.append(sql.split("\n")[0][:80])
        return query(conn, sql, params)

    monkeypatch.setattr(Prepared, "query", staticmethod(prepared_query))

    def statement(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        verb = sql.lstrip().split(None, 1)[0].upper()
        if not _ours() or verb in ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE"):
            return
        (seen.reads if verb == "SELECT" else seen.writes).append(sql.split("\n")[0][:80])

    def commit(_conn: Any) -> None:
        if _ours():
            seen.commits += 1

    event.listen(Engine, "before_cursor_execute", statement)
    event.listen(Engine, "commit", commit)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", statement)
        event.remove(Engine, "commit", commit)


def test_a_create_is_one_read_and_one_commit_and_a_destroy_answers_after_one_of_each(
    sandbox_client: TestClient,
    tenant: dict[str, Any],
    counted: Counted,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = sandbox_client
    create(client, tenant["headers"])  # the node's report has come, the tenant's totals exist
    sandboxes = services_of(client).sandboxes

    async def no_cpu_used(tenant_id: str) -> float:
        return 0.0  # the daily CPU budget's reading is cached apart (app.quotas.readings)

    monkeypatch.setattr(sandboxes.admission.readings, "cpu_seconds_today", no_cpu_used)
    who = principal(client, tenant)
    body = CreateSandbox(backend="fake")
    row = run(client, lambda: counted.call(lambda: sandboxes.create(who, body)))
    assert row.state == "running"
    assert (len(counted.reads), counted.commits) == (1, 1), counted.reads
    assert len(counted.writes) == 2, counted.writes  # the totals' update, the row's insert

    gone = run(client, lambda: counted.call(lambda: sandboxes.destroy(tenant["id"], row.id)))
    assert gone.state == "stopping"
    assert (len(counted.reads), counted.commits) == (1, 1), counted.reads
    assert len(counted.writes) == 2, counted.writes  # the row's move, the totals' update
    run(client, sandboxes.drain)  # the teardown, off the caller's task
    assert run(client, lambda: sandboxes.get(tenant["id"], row.id)).state == "stopped"
