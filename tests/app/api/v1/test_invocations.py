"""Invocation history: the stored record of a run, its filters, and tenant isolation."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.testclient import TestClient

Tenant = dict[str, Any]


def run(client: TestClient, tenant: Tenant, **behaviour: Any) -> dict[str, Any]:
    response = client.post(
        "/v1/run",
        json={"language": "fake", "code": json.dumps(behaviour)},
        headers=tenant["headers"],
    )
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def listing(client: TestClient, tenant: Tenant, **params: Any) -> dict[str, Any]:
    response = client.get("/v1/invocations", params=params, headers=tenant["headers"])
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def ids(page: dict[str, Any]) -> list[str]:
    return [inv["invocation_id"] for inv in page["invocations"]]


def test_stored_record_of_a_successful_run(
    client: TestClient, new_tenant: Callable[..., Tenant]
) -> None:
    tenant = new_tenant()
    answer = run(client, tenant, stdout="hello", stderr="warn", cpu_ms=7)
    assert answer["status"] == "succeeded"

    response = client.get(f"/v1/invocations/{answer['invocation_id']}", headers=tenant["headers"])
    assert response.status_code == 200, response.text
    stored = response.json()
    assert stored["invocation_id"] == answer["invocation_id"]
    assert stored["status"] == "succeeded"
    assert stored["kind"] == "run"
    assert stored["language"] == "fake"
    assert stored["runtime"] == "fake"
    assert stored["error"] is None
    assert stored["attempts"] == 1
    assert stored["node_id"]
    assert stored["run"]["status"] == "finished"
    assert stored["run"]["exit_code"] == 0
    assert stored["run"]["stdout"] == "hello"
    assert stored["run"]["stderr"] == "warn"
    timings = stored["timings"]
    assert timings["queue_ms"] is not None and timings["queue_ms"] >= 0
    assert timings["exec_ms"] is not None and timings["exec_ms"] >= 0
    assert timings["cpu_ms"] == 7
    assert timings["total_ms"] is not None and timings["total_ms"] >= 0
    assert stored["created_at"] <= stored["started_at"] <= stored["finished_at"]


def test_stored_record_of_a_failing_run(
    client: TestClient, new_tenant: Callable[..., Tenant]
) -> None:
    tenant = new_tenant()
    answer = run(client, tenant, stdout="partial", exit=3)
    assert answer["status"] == "failed"
    assert answer["run"]["exit_code"] == 3

    stored = client.get(
        f"/v1/invocations/{answer['invocation_id']}", headers=tenant["headers"]
    ).json()
    assert stored["status"] == "failed"
    assert stored["error"] is None  # the code failed, not the platform
    assert stored["run"]["exit_code"] == 3
    assert stored["run"]["stdout"] == "partial"
    assert stored["attempts"] == 1


def test_list_is_newest_first_and_filters(
    client: TestClient, new_tenant: Callable[..., Tenant]
) -> None:
    tenant = new_tenant()
    ok1 = run(client, tenant, stdout="1")["invocation_id"]
    bad = run(client, tenant, exit=1)["invocation_id"]
    ok2 = run(client, tenant, stdout="2")["invocation_id"]

    everything = listing(client, tenant)
    assert ids(everything) == [ok2, bad, ok1]
    assert everything["next_cursor"] is None

    assert ids(listing(client, tenant, status="succeeded")) == [ok2, ok1]
    assert ids(listing(client, tenant, status="failed")) == [bad]
    assert ids(listing(client, tenant, status="errored")) == []
    assert ids(listing(client, tenant, language="fake")) == [ok2, bad, ok1]
    assert ids(listing(client, tenant, language="python")) == []
    assert ids(listing(client, tenant, kind="run")) == [ok2, bad, ok1]
    assert ids(listing(client, tenant, kind="function")) == []


def test_list_pages_with_limit_and_cursor(
    client: TestClient, new_tenant: Callable[..., Tenant]
) -> None:
    tenant = new_tenant()
    made = [run(client, tenant, stdout=str(i))["invocation_id"] for i in range(3)]
    newest_first = made[::-1]

    first = listing(client, tenant, limit=2)
    assert ids(first) == newest_first[:2]
    assert first["next_cursor"] is not None
    second = listing(client, tenant, limit=2, cursor=first["next_cursor"])
    assert ids(second) == newest_first[2:]
    assert second["next_cursor"] is None

    assert ids(listing(client, tenant, limit=1)) == newest_first[:1]


def test_bad_list_parameters_are_422(client: TestClient, new_tenant: Callable[..., Tenant]) -> None:
    tenant = new_tenant()
    for params in ({"limit": 0}, {"limit": 501}, {"status": "done"}, {"before": "yesterday"}):
        response = client.get("/v1/invocations", params=params, headers=tenant["headers"])
        assert response.status_code == 422, (params, response.text)
        assert response.json()["error"]["code"] == "validation_error"


def test_a_tenant_never_sees_another_tenants_invocations(
    client: TestClient, new_tenant: Callable[..., Tenant]
) -> None:
    alice, bob = new_tenant(), new_tenant()
    secret = run(client, alice, stdout="alice's secret")["invocation_id"]
    own = run(client, bob, stdout="bob")["invocation_id"]

    response = client.get(f"/v1/invocations/{secret}", headers=bob["headers"])
    assert response.status_code == 404  # not 403: its existence is not revealed
    assert response.json()["error"]["code"] == "not_found"
    assert "alice's secret" not in response.text

    missing = client.get("/v1/invocations/inv_doesnotexist", headers=bob["headers"])
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == response.json()["error"]["code"]

    assert ids(listing(client, bob)) == [own]
    assert ids(listing(client, bob, status="succeeded", language="fake")) == [own]
    assert ids(listing(client, alice)) == [secret]
    assert client.get(f"/v1/invocations/{secret}", headers=alice["headers"]).status_code == 200


def test_invocations_need_a_tenant_key(client: TestClient) -> None:
    assert client.get("/v1/invocations").status_code == 401
    assert client.get("/v1/invocations/inv_x").status_code == 401
    bad = {"Authorization": "Bearer crl_key_nope_nope"}
    assert client.get("/v1/invocations", headers=bad).status_code == 401


def test_before_without_a_timezone_is_a_validation_error_not_a_500(
    client: TestClient, new_tenant: Callable[..., Tenant]
) -> None:
    """A naive ``before`` is refused as input (it used to reach the column type: a 500)."""
    tenant = new_tenant()
    for before in ("2030-01-01T00:00:00", "2030-01-01"):
        response = client.get(
            "/v1/invocations", params={"before": before}, headers=tenant["headers"]
        )
        assert response.status_code == 422, (before, response.text)
        assert response.json()["error"]["code"] == "validation_error"


def test_paging_does_not_skip_rows_with_equal_timestamps(
    client: TestClient, new_tenant: Callable[..., Tenant]
) -> None:
    """Rows created in the same instant all appear exactly once across pages."""
    from datetime import UTC, datetime

    from sqlalchemy import update

    from app.db import invocations as repo
    from app.db.models import Invocation

    tenant = new_tenant()
    services = client.app.state.services  # type: ignore[attr-defined]
    instant = datetime(2030, 1, 1, tzinfo=UTC)

    async def insert() -> None:
        async with services.sessions.begin() as session:
            writes = [
                repo.Create(
                    invocation_id=f"inv_tie{n}",
                    tenant_id=tenant["id"],
                    kind="run",
                    runtime="fake",
                    language="fake",
                    request={},
                    claim="c",
                    job="{}",
                )
                for n in range(5)
            ]
            conn = await session.connection()
            await conn.run_sync(repo.Create.run_many, writes)
            await session.execute(
                update(Invocation)
                .where(Invocation.id.like("inv_tie%"))
                .values(created_at=instant, status="succeeded", job=None)
            )

    client.portal.call(insert)  # type: ignore[union-attr]
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        page = listing(client, tenant, limit=2, **({"cursor": cursor} if cursor else {}))
        seen += ids(page)
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == [f"inv_tie{n}" for n in range(5)]


def test_a_forged_cursor_is_422(client: TestClient, new_tenant: Callable[..., Tenant]) -> None:
    tenant = new_tenant()
    for cursor in ("garbage", "2030-01-01T00:00:00|inv_x", "|inv_x", "2030-01-01T00:00:00+00:00|"):
        response = client.get(
            "/v1/invocations", params={"cursor": cursor}, headers=tenant["headers"]
        )
        assert response.status_code == 422, (cursor, response.text)
        assert response.json()["error"]["code"] == "validation_error"


def test_output_with_a_nul_is_stored_and_answered_whole(
    make_settings: Callable[..., Any], stack: dict[str, Any]
) -> None:
    """A program may print NUL; PostgreSQL's text columns cannot hold it. The result is
    stored all the same (never retried forever) and answered byte for byte."""
    from app.main import create_app
    from tests.conftest import ADMIN

    settings = make_settings(result_wait_grace_seconds=3, **stack)
    with TestClient(create_app(settings)) as client:
        created = client.post("/v1/tenants", json={"name": "nul"}, headers=ADMIN).json()
        tenant = {"headers": {"Authorization": f"Bearer {created['key']['api_key']}"}}
        answer = run(client, tenant, stdout="a\x00b", stderr="\x00")
        assert answer["status"] == "succeeded", answer
        assert (answer["run"]["stdout"], answer["run"]["stderr"]) == ("a\x00b", "\x00")
        stored = client.get(f"/v1/invocations/{answer['invocation_id']}", headers=tenant["headers"])
        assert stored.json()["run"]["stdout"] == "a\x00b"
        plain = run(client, tenant, stdout="plain")
        assert plain["run"]["stdout"] == "plain"


def test_key_labels_refuse_control_characters(client: TestClient) -> None:
    from tests.conftest import ADMIN

    response = client.post(
        "/v1/tenants", json={"name": "labels", "key_name": "a\x00b"}, headers=ADMIN
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "validation_error"
