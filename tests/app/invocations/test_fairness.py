"""Fairness across tenants: a node takes queued work one tenant after another, so a
tenant's wait does not grow with another tenant's backlog. Both stacks (in-process, and
Redis with a node reading the tenants' overflow streams in turn)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.conftest import ADMIN


def tenant(client: TestClient, name: str) -> dict[str, str]:
    created = client.post("/v1/tenants", json={"name": name}, headers=ADMIN)
    assert created.status_code == 201, created.text
    return {"Authorization": f"Bearer {created.json()['key']['api_key']}"}


def run(client: TestClient, headers: dict[str, str], **program: Any) -> Any:
    body = {"language": "fake", "code": json.dumps(program)}
    response = client.post("/v1/run", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def rows(client: TestClient, headers: dict[str, str]) -> list[dict[str, Any]]:
    return list(client.get("/v1/invocations", headers=headers).json()["invocations"])


def test_a_tenants_call_does_not_wait_behind_another_tenants_backlog(
    make_settings: Callable[..., Settings], stack: dict[str, Any]
) -> None:
    """Two slots; tenant A queues eight calls of a second; tenant B then sends one. FIFO
    would start B's call after all of A's; taken in turn, it starts after at most the two
    A calls running when it arrived and one more."""
    with TestClient(create_app(make_settings(node_slots=2, **stack))) as client:
        a, b = tenant(client, "busy"), tenant(client, "quiet")
        with ThreadPoolExecutor(9) as pool:
            backlog = [pool.submit(run, client, a, sleep=1.0) for _ in range(8)]
            deadline = time.monotonic() + 30
            while sum(r["status"] == "queued" for r in rows(client, a)) < 6:
                assert time.monotonic() < deadline, rows(client, a)
                time.sleep(0.02)
            quiet = run(client, b, stdout="quick")
            for call in backlog:
                assert call.result()["status"] == "succeeded"
        assert quiet["status"] == "succeeded"
        b_started = datetime.fromisoformat(rows(client, b)[0]["started_at"])
        a_started = [datetime.fromisoformat(r["started_at"]) for r in rows(client, a)]
    ahead = sum(started < b_started for started in a_started)
    assert ahead <= 3, f"{ahead} of tenant A's 8 calls started before tenant B's one"


def test_each_tenant_is_served_in_turn(
    make_settings: Callable[..., Settings], stack: dict[str, Any], tmp_path: Path
) -> None:
    """With one slot and three tenants' backlogs, the order of starts goes round. The
    blocker holds the slot until every call is queued, however slow the machine."""
    n = 3
    release = tmp_path / "release"
    with TestClient(create_app(make_settings(node_slots=1, **stack))) as client:
        tenants = [tenant(client, f"t{i}") for i in range(n)]
        with ThreadPoolExecutor(3 * n + 1) as pool:  # the blocker and every call at once
            blocker = pool.submit(run, client, tenants[0], until_file=str(release))
            deadline = time.monotonic() + 30
            while not any(r["status"] == "running" for r in rows(client, tenants[0])):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            calls = [pool.submit(run, client, t, sleep=0.05) for t in tenants for _ in range(3)]
            while sum(r["status"] == "queued" for t in tenants for r in rows(client, t)) < 3 * n:
                assert time.monotonic() < deadline, [rows(client, t) for t in tenants]
                time.sleep(0.02)
            release.touch()
            blocker.result()
            for call in calls:
                call.result()
        starts = sorted(
            (datetime.fromisoformat(r["started_at"]), i)
            for i, t in enumerate(tenants)
            for r in rows(client, t)
        )
    order = [i for _, i in starts][1:]  # after the blocker
    # Round by round, every tenant once: no tenant is served twice while another waits.
    rounds = [order[k : k + n] for k in range(0, len(order), n)]
    assert all(sorted(r) == list(range(n)) for r in rounds), order
