"""SandboxFusion compatibility at the protocol level (on the fake backend).

The real clients against real jails are in tests/compat/."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from app.db.models import Invocation
from tests.conftest import ADMIN, free_port, keyless_url


def sf(program: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"language": "fake", "code": json.dumps(program), **fields}


def test_ping_answers_pong(client: TestClient) -> None:
    response = client.get("/v1/ping")
    assert response.status_code == 200
    assert response.json() == "pong"


def test_run_code_success_shape(client: TestClient, new_tenant: Any) -> None:
    tenant = new_tenant()
    response = client.post(
        "/run_code", json=sf({"stdout": "hi\n"}, stdin=None), headers=tenant["headers"]
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "Success"
    assert body["compile_result"] is None
    run = body["run_result"]
    assert run["status"] == "Finished" and run["return_code"] == 0
    assert run["stdout"] == "hi\n" and run["stderr"] == ""
    assert isinstance(run["execution_time"], float)
    assert body["files"] == {}
    assert set(body) == {
        "status",
        "message",
        "compile_result",
        "run_result",
        "executor_pod_name",
        "files",
        "capped",  # Corral's: what a quota lowered (clients ignore what they do not know)
    }


def test_run_code_failure_and_timeout(client: TestClient, new_tenant: Any) -> None:
    headers = new_tenant()["headers"]
    failed = client.post("/run_code", json=sf({"exit": 3}), headers=headers).json()
    assert failed["status"] == "Failed"
    assert failed["run_result"]["status"] == "Finished"
    assert failed["run_result"]["return_code"] == 3
    timed = client.post("/run_code", json=sf({"sleep": 5}, run_timeout=0.2), headers=headers).json()
    assert timed["status"] == "Failed"
    assert timed["run_result"]["status"] == "TimeLimitExceeded"


def test_platform_failure_is_sandbox_error(client: TestClient, new_tenant: Any) -> None:
    body = client.post("/run_code", json=sf({"crash": True}), headers=new_tenant()["headers"])
    assert body.status_code == 200
    assert body.json()["status"] == "SandboxError"
    assert "crashed" in body.json()["message"]


def test_limits_over_quota_are_capped_not_refused(client: TestClient, new_tenant: Any) -> None:
    tenant = new_tenant(max_memory_mb=256, max_wall_seconds=5)
    body = client.post(
        "/run_code", json=sf({}, memory_limit_MB=4096, run_timeout=60), headers=tenant["headers"]
    ).json()
    assert body["status"] == "Success"
    assert body["capped"] == {
        "memory_mb": {"requested": 4096, "granted": 256},
        "run_timeout_s": {"requested": 60, "granted": 5},
        "compile_timeout_s": {"requested": 10, "granted": 5},  # SandboxFusion's default
    }
    listed = client.get("/v1/invocations", headers=tenant["headers"]).json()["invocations"]
    assert listed[0]["status"] == "succeeded"
    # The stored request shows the limits it ran under: the capped ones.
    services = client.app.state.services  # type: ignore[attr-defined]

    async def stored_limits() -> Any:
        async with services.sessions() as session:
            row = await session.get(Invocation, listed[0]["invocation_id"])
            return row.request["limits"]

    limits = client.portal.call(stored_limits)  # type: ignore[union-attr]
    assert (limits["memory_mb"], limits["run_timeout_s"]) == (256, 5.0)
    assert limits["compile_timeout_s"] == 5.0  # 10 s asked by default, capped too
    assert limits["compile_memory_mb"] == 256  # a compile gets no more than the maximum


def test_a_request_within_the_quota_says_nothing_was_capped(
    client: TestClient, new_tenant: Any
) -> None:
    body = client.post("/run_code", json=sf({}), headers=new_tenant()["headers"]).json()
    assert body["status"] == "Success" and body["capped"] is None


def test_extra_fields_and_null_files_are_tolerated(client: TestClient, new_tenant: Any) -> None:
    body = sf({}, files={"a.txt": None}, extra={"x": 1})
    response = client.post("/run_code", json=body, headers=new_tenant()["headers"])
    assert response.status_code == 200
    assert response.json()["status"] == "Success"


def test_keyless_in_testclient_is_refused_without_default_tenant(client: TestClient) -> None:
    response = client.post("/run_code", json=sf({}))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "missing_api_key"


def test_keyless_listener_uses_the_default_tenant(live_server: Any) -> None:
    port = free_port()
    url = live_server(default_tenant="default", keyless_port=port)
    response = httpx.post(f"{keyless_url(port)}/run_code", json=sf({"stdout": "ok"}), timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["run_result"]["stdout"] == "ok"
    tenants = httpx.get(f"{url}/v1/tenants", headers=ADMIN).json()["tenants"]
    assert [t["name"] for t in tenants] == ["default"]
    # Keyless access is only for the SandboxFusion endpoint, never the rest of the API.
    assert httpx.get(f"{keyless_url(port)}/v1/invocations").status_code == 401


@pytest.mark.parametrize(
    "bad",
    [
        {"code": "x"},
        {"language": "python"},
        {"code": 1, "language": 2},
        {"code": "", "language": "python", "run_timeout": -1},
    ],
)
def test_run_code_bad_input(client: TestClient, new_tenant: Any, bad: dict[str, Any]) -> None:
    response = client.post("/run_code", json=bad, headers=new_tenant()["headers"])
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "validation_error"


def test_batch_runs_in_order_with_per_item_errors(client: TestClient, new_tenant: Any) -> None:
    headers = new_tenant()["headers"]
    runs = [
        {"language": "fake", "code": json.dumps({"stdout": str(i), "sleep": 0.05 * (5 - i)})}
        for i in range(5)
    ]
    runs.append({"language": "cobol", "code": ""})
    response = client.post("/v1/run/batch", json={"runs": runs}, headers=headers)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["result"]["run"]["stdout"] for r in results[:5]] == ["0", "1", "2", "3", "4"]
    assert results[5]["result"] is None
    assert results[5]["error"]["code"] == "unsupported_runtime"
    ids = {r["result"]["invocation_id"] for r in results[:5]}
    assert len(ids) == 5


def test_batch_bounds(client: TestClient, new_tenant: Any) -> None:
    headers = new_tenant()["headers"]
    assert client.post("/v1/run/batch", json={"runs": []}, headers=headers).status_code == 422
    many = [{"language": "fake", "code": "{}"}] * 257
    assert client.post("/v1/run/batch", json={"runs": many}, headers=headers).status_code == 422
