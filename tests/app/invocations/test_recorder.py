"""The recorder, through the API, on both stacks: the answer is the stored row whatever the
output's size, a failed write is retried until it is stored (never dropped), nothing is
acknowledged before it is stored, and a result whose write always fails goes to the dead
letters without holding up the others."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.db import invocations
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
        first = run(client, headers, {"stdout": "one"})  # its Started+Finished pass: stored
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


def test_a_result_that_is_never_stored_goes_to_the_dead_letters_and_the_stream_moves_on(
    make_settings: Callable[..., Settings], stack: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poison result (its write fails every time, for a reason of its own) is tried
    ``record_tries`` times, then kept as a dead letter, its invocation ended errored with
    ``result_not_stored``, and the results after it are stored as ever."""
    real = invocations.Finish.values

    def poisoned(self: invocations.Finish, now: datetime) -> Any:
        if self.result.run is not None and self.result.run.stdout.startswith("poison"):
            raise ValueError("this result cannot be stored")
        return real(self, now)

    monkeypatch.setattr(invocations.Finish, "values", poisoned)
    # a result that never came would be answered 504 after this grace
    settings = make_settings(record_tries=3, result_wait_grace_seconds=2.0, **stack)
    with TestClient(create_app(settings)) as client:
        created = client.post("/v1/tenants", json={"name": "dl"}, headers=ADMIN).json()
        headers = {"Authorization": f"Bearer {created['key']['api_key']}"}
        poison = run(client, headers, {"stdout": "poison"})
        after = run(client, headers, {"stdout": "after"})
        with ThreadPoolExecutor(6) as pool:  # a poison among others, at once
            answers = list(
                pool.map(
                    lambda out: run(client, headers, {"stdout": out}),
                    ["poison-2", *(f"ok-{i}" for i in range(5))],
                )
            )
        letters = client.get("/v1/admin/dead-letters", headers=ADMIN)
        stored = client.get(f"/v1/invocations/{poison['invocation_id']}", headers=headers)
        metrics = client.get("/metrics").text

    assert (poison["status"], poison["error"].split(":")[0]) == ("errored", "result_not_stored")
    assert stored.json()["status"] == "errored" and stored.json()["error"] == poison["error"]
    assert (after["status"], after["run"]["stdout"]) == ("succeeded", "after")
    assert answers[0]["error"].startswith("result_not_stored:")
    assert [a["status"] for a in answers[1:]] == ["succeeded"] * 5
    assert letters.status_code == 200, letters.text
    kept = letters.json()["dead_letters"]
    assert {d["invocation_id"] for d in kept} == {
        poison["invocation_id"],
        answers[0]["invocation_id"],
    }
    assert all(d["kind"] == "finished" and d["tries"] == 3 for d in kept)
    assert all("cannot be stored" in d["error"] and '"poison' in d["event"] for d in kept)
    assert 'corral_recorder_events_total{outcome="dead_lettered"} 2.0' in metrics
