"""Admission control through the HTTP API: queueing, and the three 429s with Retry-After.

The ``fake`` runtime's code is a JSON program: ``{"stdout": "hi", "sleep": 0.3}``.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.conftest import ADMIN


def program(**behaviour: Any) -> dict[str, Any]:
    return {"language": "fake", "code": json.dumps(behaviour)}


def run(client: TestClient, headers: dict[str, str], **behaviour: Any) -> httpx.Response:
    return client.post("/v1/run", json=program(**behaviour), headers=headers)


def assert_429(response: httpx.Response, code: str) -> int:
    assert response.status_code == 429, response.text
    assert response.json()["error"]["code"] == code
    retry_after = int(response.headers["Retry-After"])
    assert retry_after >= 1
    return retry_after


def invocations(client: TestClient, headers: dict[str, str]) -> list[dict[str, Any]]:
    response = client.get("/v1/invocations", headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["invocations"]  # type: ignore[no-any-return]


def test_over_the_concurrency_quota_requests_queue_and_all_succeed(
    client: TestClient, new_tenant: Callable[..., dict[str, Any]]
) -> None:
    tenant = new_tenant(max_concurrent_executions=1)
    with ThreadPoolExecutor(4) as pool:
        futures = [
            pool.submit(run, client, tenant["headers"], stdout=f"n{i}", sleep=0.3) for i in range(4)
        ]
        responses = [f.result() for f in futures]

    assert [r.status_code for r in responses] == [200] * 4, [r.text for r in responses]
    assert sorted(r.json()["run"]["stdout"] for r in responses) == ["n0", "n1", "n2", "n3"]
    assert {r.json()["status"] for r in responses} == {"succeeded"}

    # They ran one at a time: each started after the one before it had finished.
    rows = sorted(invocations(client, tenant["headers"]), key=lambda r: r["started_at"])
    assert len(rows) == 4
    for before, after in itertools.pairwise(rows):
        assert datetime.fromisoformat(after["started_at"]) >= datetime.fromisoformat(
            before["finished_at"]
        )


@pytest.fixture
def short_queue_client(
    make_settings: Callable[..., Settings], stack: dict[str, Any]
) -> Iterator[TestClient]:
    settings = make_settings(admission_queue_seconds=0.2, **stack)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_past_the_admission_wait_requests_get_429_concurrency_limited(
    short_queue_client: TestClient,
) -> None:
    client = short_queue_client
    created = client.post(
        "/v1/tenants",
        json={"name": "busy", "quota": {"max_concurrent_executions": 1}},
        headers=ADMIN,
    )
    assert created.status_code == 201, created.text
    headers = {"Authorization": f"Bearer {created.json()['key']['api_key']}"}

    with ThreadPoolExecutor(3) as pool:
        holder = pool.submit(run, client, headers, stdout="held", sleep=1.5)
        # The row is inserted only once the slot is held: wait for it to appear.
        deadline = time.monotonic() + 10
        while not invocations(client, headers):
            assert time.monotonic() < deadline, "the holder never got its slot"
            time.sleep(0.02)
        contenders = [pool.submit(run, client, headers, stdout="late") for _ in range(2)]
        refused = [f.result() for f in contenders]
        held = holder.result()

    for response in refused:
        assert_429(response, "concurrency_limited")
    assert held.status_code == 200, held.text
    assert held.json()["run"]["stdout"] == "held"
    assert len(invocations(client, headers)) == 1  # refused requests leave no record


def test_executions_per_second_spent_gives_429_rate_limited(
    client: TestClient, new_tenant: Callable[..., dict[str, Any]]
) -> None:
    # One token per 100 s: the third request's wait is far past the 30 s admission wait.
    tenant = new_tenant(executions_per_second=0.01, burst=2)
    for _ in range(2):
        assert run(client, tenant["headers"]).status_code == 200
    response = run(client, tenant["headers"])
    assert assert_429(response, "rate_limited") == 100

    other = new_tenant(executions_per_second=0.01, burst=2)
    assert run(client, other["headers"]).status_code == 200  # buckets are per tenant


def test_cpu_budget_used_up_gives_429_cpu_quota_exhausted(
    client: TestClient, new_tenant: Callable[..., dict[str, Any]]
) -> None:
    tenant = new_tenant(cpu_seconds_per_day=0.01)
    first = run(client, tenant["headers"], cpu_ms=50)
    assert first.status_code == 200, first.text
    assert first.json()["timings"]["cpu_ms"] == 50

    # Today's usage is cached for about a second on the admission path: poll.
    deadline = time.monotonic() + 10
    while (response := run(client, tenant["headers"], cpu_ms=50)).status_code == 200:
        assert time.monotonic() < deadline, "the CPU budget was never enforced"
        time.sleep(0.1)

    retry_after = assert_429(response, "cpu_quota_exhausted")
    now = datetime.now(UTC)
    to_midnight = 86_400 - (now.hour * 3600 + now.minute * 60 + now.second)
    assert abs(retry_after - to_midnight) <= 5

    other = new_tenant(cpu_seconds_per_day=0.01)
    assert run(client, other["headers"]).status_code == 200  # budgets are per tenant
