"""A connection lost while an invocation's row is committed: the commit may have landed.

The database made the row durable but its answer was lost (PostgreSQL stopped with
``-m immediate`` mid-commit does this). Answering 503 "not recorded" would then be false:
the reconciler runs the stored Job, and a client that retries runs the code twice. The
gateway asks again until the database answers; if it does not in time, the answer says the
outcome is unknown and names the invocation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError
from starlette.testclient import TestClient

from app.db import invocations
from app.db.transactions import Transactions, Write
from app.main import create_app
from app.settings import Settings
from tests.conftest import ADMIN

RUN = {"language": "fake", "code": '{"stdout": "once"}'}


class LosesTheAnswer:
    """A committer whose first commit that inserts an invocation lands and then raises a
    lost connection; the database then stays down for ``down_for`` transactions (or
    until ``down`` is cleared)."""

    def __init__(self, real: Transactions, *, down_for: int) -> None:
        self._real = real
        self.down_for = down_for
        self.down = False
        self.lost = 0
        self.refused = 0

    async def run(self, ops: Sequence[Write]) -> list[Any]:
        if self.down or (self.lost and self.refused < self.down_for):
            self.refused += 1
            raise OperationalError("BEGIN", None, ConnectionRefusedError("the server is down"))
        results = await self._real.run(ops)
        if not self.lost and any(isinstance(op, invocations.Create) for op in ops):
            self.lost += 1
            self.down = self.down_for < 0
            raise OperationalError("COMMIT", None, ConnectionResetError("lost after commit"))
        return results

    async def close(self) -> None:
        await self._real.close()


@pytest.fixture
def lossy(monkeypatch: pytest.MonkeyPatch) -> Callable[[TestClient, int], LosesTheAnswer]:
    def install(client: TestClient, down_for: int) -> LosesTheAnswer:
        writer = client.app.state.services.writer  # type: ignore[attr-defined]
        committer = LosesTheAnswer(writer._transactions, down_for=down_for)
        monkeypatch.setattr(writer, "_transactions", committer)
        return committer

    return install


def tenant_headers(client: TestClient) -> dict[str, str]:
    created = client.post("/v1/tenants", json={"name": "lossy"}, headers=ADMIN)
    assert created.status_code == 201, created.text
    return {"Authorization": f"Bearer {created.json()['key']['api_key']}"}


def test_a_commit_whose_answer_was_lost_is_answered_once_the_database_is_back(
    make_settings: Callable[..., Settings],
    stack: dict[str, Any],
    lossy: Callable[[TestClient, int], LosesTheAnswer],
) -> None:
    with TestClient(create_app(make_settings(**stack))) as client:
        headers = tenant_headers(client)
        sessions = lossy(client, 3)
        response = client.post("/v1/run", json=RUN, headers=headers)
        assert sessions.lost == 1 and sessions.refused == 3
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["status"] == "succeeded" and body["run"]["stdout"] == "once"
        listed = client.get("/v1/invocations", headers=headers).json()["invocations"]
        assert [i["invocation_id"] for i in listed] == [body["invocation_id"]]


def test_a_database_that_stays_down_gets_an_answer_that_says_unknown(
    make_settings: Callable[..., Settings],
    stack: dict[str, Any],
    lossy: Callable[[TestClient, int], LosesTheAnswer],
) -> None:
    settings = make_settings(**stack, record_retry_seconds=0.3)
    with TestClient(create_app(settings)) as client:
        headers = tenant_headers(client)
        sessions = lossy(client, -1)
        response = client.post("/v1/run", json=RUN, headers=headers)
        assert sessions.lost == 1 and sessions.refused >= 1
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "database_unavailable"
        assert error["details"]["recorded"] == "unknown"
        invocation_id = error["details"]["invocation_id"]
        sessions.down = False
        # The commit had landed: the id names a stored invocation, which is run.
        deadline = time.monotonic() + 60
        while True:
            found = client.get(f"/v1/invocations/{invocation_id}", headers=headers)
            assert found.status_code == 200, found.text
            if found.json()["status"] not in ("queued", "running"):
                break
            assert time.monotonic() < deadline, found.json()
            time.sleep(0.1)
        assert found.json()["status"] == "succeeded"
        assert found.json()["run"]["stdout"] == "once"
