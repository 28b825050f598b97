"""A node dies holding an execution: it is finished by another node, or failed with a
clear reason; never lost, never run twice without saying so. Real Redis, PostgreSQL and
``corral gateway`` / ``corral node`` processes; the node is killed with SIGKILL."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN, ADMIN_KEY
from tests.integration.conftest import Procs, free_port, wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.redis, pytest.mark.postgres]


def _env(postgres_url: str, redis_url: str, **extra: str) -> dict[str, str]:
    return {
        "CORRAL_DEV_MODE": "1",
        "CORRAL_ADMIN_KEY": ADMIN_KEY,
        "CORRAL_DATABASE_URL": postgres_url,
        "CORRAL_REDIS_URL": redis_url,
        "CORRAL_RUNTIMES": '["fake"]',
        "CORRAL_HEARTBEAT_SECONDS": "0.3",
        "CORRAL_NODE_DEAD_AFTER_SECONDS": "1.5",
        "CORRAL_NODE_SLOTS": "1",
        "CORRAL_NODE_PORT": "0",
        **extra,
    }


def _start_cluster(procs: Procs, env: dict[str, str]) -> tuple[str, dict[str, str]]:
    port = free_port()
    procs.start("gateway", "gateway", "--port", str(port), **env)
    url = f"http://127.0.0.1:{port}"
    procs.start("node-a", "node", **env, CORRAL_NODE_ID="node-a")
    wait_ready(url, nodes=1)
    created = httpx.post(f"{url}/v1/tenants", json={"name": "rl"}, headers=ADMIN, timeout=10)
    assert created.status_code == 201, created.text
    return url, {"Authorization": f"Bearer {created.json()['key']['api_key']}"}


def _run_in_background(url: str, headers: dict[str, str], program: dict[str, Any]) -> Any:
    outcome: dict[str, Any] = {}

    def call() -> None:
        outcome["response"] = httpx.post(
            f"{url}/v1/run",
            json={"language": "fake", "code": json.dumps(program), "run_timeout": 30},
            headers=headers,
            timeout=120,
        )

    thread = threading.Thread(target=call)
    thread.start()
    return thread, outcome


def _wait_running_on(url: str, headers: dict[str, str], node: str) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        listed = httpx.get(f"{url}/v1/invocations?status=running", headers=headers).json()
        for inv in listed["invocations"]:
            if inv["node_id"] == node:
                return str(inv["invocation_id"])
        time.sleep(0.05)
    raise AssertionError(f"no invocation running on {node}")


def test_execution_held_by_a_killed_node_is_finished_by_another(
    corral_procs: Procs, postgres_url: str, redis_url: str
) -> None:
    env = _env(postgres_url, redis_url)
    url, headers = _start_cluster(corral_procs, env)
    thread, outcome = _run_in_background(url, headers, {"sleep": 6.0, "stdout": "done"})
    invocation_id = _wait_running_on(url, headers, "node-a")

    corral_procs.start("node-b", "node", **env, CORRAL_NODE_ID="node-b")
    wait_ready(url, nodes=2)
    corral_procs.kill("node-a")
    thread.join(90)

    response = outcome["response"]
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["invocation_id"] == invocation_id
    assert body["status"] == "succeeded"
    assert body["run"]["stdout"] == "done"
    assert body["attempts"] == 2  # the re-run is stated, not hidden
    stored = httpx.get(f"{url}/v1/invocations/{invocation_id}", headers=headers).json()
    assert stored["status"] == "succeeded"
    assert stored["node_id"] == "node-b"
    assert stored["attempts"] == 2
    # And the cluster keeps working.
    again = httpx.post(
        f"{url}/v1/run",
        json={"language": "fake", "code": '{"stdout": "ok"}'},
        headers=headers,
        timeout=60,
    ).json()
    assert again["status"] == "succeeded" and again["attempts"] == 1


def test_execution_past_its_attempts_is_failed_with_a_reason(
    corral_procs: Procs, postgres_url: str, redis_url: str
) -> None:
    env = _env(postgres_url, redis_url, CORRAL_MAX_ATTEMPTS="1")
    url, headers = _start_cluster(corral_procs, env)
    thread, outcome = _run_in_background(url, headers, {"sleep": 6.0, "stdout": "never"})
    invocation_id = _wait_running_on(url, headers, "node-a")

    corral_procs.start("node-b", "node", **env, CORRAL_NODE_ID="node-b")
    wait_ready(url, nodes=2)
    corral_procs.kill("node-a")
    thread.join(90)

    body = outcome["response"].json()
    assert body["invocation_id"] == invocation_id
    assert body["status"] == "errored"
    assert body["error"].startswith("lost:")
    assert "not run again" in body["error"]
    stored = httpx.get(f"{url}/v1/invocations/{invocation_id}", headers=headers).json()
    assert stored["status"] == "errored" and stored["error"] == body["error"]
