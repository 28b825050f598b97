"""The recorder, through the API, on both stacks: the answer is the stored row whatever the
output's size, a failed write is retried until it is stored (never dropped), and nothing
is acknowledged before it is stored."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.db import invocations
from app.db.transactions import Transactions, Write
from app.http.listeners import KeylessListener
from app.main import create_app
from app.settings import Settings
from tests.conftest import ADMIN


def run(client: TestClient, headers: dict[str, str], program: dict[str, Any]) -> Any:
    response = client.post(
        "/v1/run", json={"language": "fake", "code": json.dumps(program)}, headers=headers
    )
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("size", [10, 300_000], ids=["small", "large"])
def test_the_answer_is_the_stored_row_whatever_the_output(
    client: TestClient, new_tenant: Callable[..., dict[str, Any]], size: int
) -> None:
    tenant = new_tenant()
    answer = run(client, tenant["headers"], {"stdout": "x" * size, "stderr": "e"})
    stored = client.get(f"/v1/invocations/{answer['invocation_id']}", headers=tenant["headers"])
    body = stored.json()
    for extra in ("kind", "language", "runtime", "node_id", "started_at", "finished_at"):
        body.pop(extra)
    assert answer == body
    assert answer["timings"]["total_ms"] is not None and answer["run"]["stdout"] == "x" * size


@pytest.mark.parametrize("size", [10, 300_000], ids=["small", "large"])
def test_run_code_names_the_node_whatever_the_output(
    make_settings: Callable[..., Settings], stack: dict[str, Any], size: int
) -> None:
    settings = make_settings(default_tenant="default", **stack)
    with TestClient(KeylessListener(create_app(settings))) as client:
        response = client.post(
            "/run_code", json={"language": "fake", "code": json.dumps({"stdout": "y" * size})}
        )
    assert response.status_code == 200, response.text
    assert response.json()["executor_pod_name"] is not None


def test_a_result_write_that_fails_is_retried_and_stored(
    make_settings: Callable[..., Settings], stack: dict[str, Any]
) -> None:
    settings = make_settings(failpoints={"recorder.before_commit": "after:1:raise-once"}, **stack)
    with TestClient(create_app(settings)) as client:
        created = client.post("/v1/tenants", json={"name": "rw"}, headers=ADMIN).json()
        headers = {"Authorization": f"Bearer {created['key']['api_key']}"}
        first = run(client, headers, {"stdout": "one"})  # its result passes: stored
        second = run(client, headers, {"stdout": "two"})  # the first try fails, then stored
        assert (first["status"], second["status"]) == ("succeeded", "succeeded")
        assert second["run"]["stdout"] == "two"
        stored = client.get(f"/v1/invocations/{second['invocation_id']}", headers=headers)
        assert stored.json()["status"] == "succeeded"
        metrics = client.get("/metrics").text
    retried = [
        line
        for line in metrics.splitlines()
        if line.startswith('corral_recorder_events_total{outcome="retried"}')
    ]
    assert retried and float(retried[0].split()[-1]) >= 1


class Noting:
    """A committer that notes which invocations got a ``MarkRunning`` write."""

    def __init__(self, real: Transactions) -> None:
        self._real = real
        self.running: list[str] = []

    async def run(self, ops: Sequence[Write]) -> list[Any]:
        self.running += [op.invocation_id for op in ops if isinstance(op, invocations.MarkRunning)]
        return await self._real.run(ops)

    async def close(self) -> None:
        await self._real.close()


@pytest.mark.slow
def test_a_quick_call_is_written_twice_and_a_long_one_shows_it_runs(
    make_settings: Callable[..., Settings], stack: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node reports an execution started only once it has run for its
    ``started_report_after_ms`` (here 1 s, so that a loaded machine's stall cannot make a
    quick call long): a quick call's row is written when it is queued and when it ends; a
    long one is seen running meanwhile."""
    settings = make_settings(started_report_after_ms=1000, **stack)
    with TestClient(create_app(settings)) as client:
        created = client.post("/v1/tenants", json={"name": "quick"}, headers=ADMIN).json()
        headers = {"Authorization": f"Bearer {created['key']['api_key']}"}
        writer = client.app.state.services.writer  # type: ignore[attr-defined]
        noting = Noting(writer._transactions)
        monkeypatch.setattr(writer, "_transactions", noting)
        _quick_and_long(client, headers, noting)


def _quick_and_long(client: TestClient, headers: dict[str, str], noting: Noting) -> None:
    # quick, though long enough that a Started sent at the claim would be stored first
    quick = [run(client, headers, {"stdout": "q", "sleep": 0.2})["invocation_id"] for _ in range(3)]
    assert noting.running == []
    with ThreadPoolExecutor(1) as caller:
        slow = caller.submit(run, client, headers, {"stdout": "s", "sleep": 2.0})
        deadline = time.monotonic() + 10
        seen: list[str] = []
        while time.monotonic() < deadline and "running" not in seen:
            listed = client.get("/v1/invocations", params={"limit": 1}, headers=headers).json()
            seen.append(listed["invocations"][0]["status"])
            time.sleep(0.02)
        answer = slow.result()
    assert "running" in seen and answer["status"] == "succeeded"
    assert noting.running == [answer["invocation_id"]] and answer["invocation_id"] not in quick
