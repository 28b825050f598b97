"""Throttling that shows, and defaults that do not throttle one box, on both stacks: the
keyless tenant is paced by the machine, not by a rate (one made by an older version with
the old 200 calls/s is lifted); a refused request carries Retry-After and RateLimit-*, a
delayed one says it was delayed; both are counted in a metric, in the tenant's API
answer and on the console's tenant page."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.main import create_app
from app.quotas.spec import OLD_PACING, PACING, QuotaLimits
from app.settings import Settings
from tests.app.api.console.test_console import sign_in
from tests.conftest import ADMIN, ADMIN_KEY


def run(client: TestClient, headers: dict[str, str]) -> Any:
    return client.post(
        "/v1/run", json={"language": "fake", "code": json.dumps({"stdout": "x"})}, headers=headers
    )


def _tenant_named(client: TestClient, name: str) -> dict[str, Any]:
    listed = client.get("/v1/tenants", params={"limit": 500}, headers=ADMIN).json()["tenants"]
    found: dict[str, Any] = next(t for t in listed if t["name"] == name)
    return found


def test_the_keyless_tenant_is_not_paced_and_an_older_one_is_lifted(
    make_settings: Callable[..., Settings], stack: dict[str, Any], tmp_path: Path
) -> None:
    highest = {name: QuotaLimits.model_fields[name].metadata for name in PACING}
    old = {"name": "old-box", "quota": OLD_PACING}
    with TestClient(create_app(make_settings(default_tenant="box", **stack))) as client:
        made = _tenant_named(client, "box")
        # as an older `make run` made its keyless tenant: the old pacing defaults
        assert client.post("/v1/tenants", json=old, headers=ADMIN).status_code == 201
        keyed = client.post("/v1/tenants", json={"name": "keyed"}, headers=ADMIN).json()
    for name, metadata in highest.items():
        bound = next(m.le for m in metadata if getattr(m, "le", None))
        assert made["quota"][name] == bound, name
    assert keyed["tenant"]["quota"]["executions_per_second"] >= 5_000  # above one machine

    with TestClient(create_app(make_settings(default_tenant="old-box", **stack))) as client:
        lifted = _tenant_named(client, "old-box")
    assert lifted["quota"]["executions_per_second"] == 1_000_000
    assert lifted["quota"]["max_concurrent_executions"] == 100_000


def test_an_operator_set_pacing_quota_holds_for_the_keyless_tenant(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_QUOTA_EXECUTIONS_PER_SECOND", "50")
    with TestClient(create_app(make_settings(default_tenant="box"))) as client:
        quota = _tenant_named(client, "box")["quota"]
    assert quota["executions_per_second"] == 50
    assert quota["burst"] == 10_000_000


def _throttled(metrics: str, tenant_id: str, quota: str, outcome: str) -> float:
    start = f'corral_throttled_total{{outcome="{outcome}",quota="{quota}",tenant="{tenant_id}"}}'
    lines = [line for line in metrics.splitlines() if line.startswith(start)]
    return float(lines[0].split()[-1]) if lines else 0.0


def test_a_refused_request_says_which_limit_and_when_and_it_is_counted_and_shown(
    client: TestClient, new_tenant: Callable[..., dict[str, Any]]
) -> None:
    tenant = new_tenant(executions_per_second=0.01, burst=1)
    assert run(client, tenant["headers"]).status_code == 200
    refused = run(client, tenant["headers"])
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["details"] == {"quota": "executions_per_second"}
    assert refused.headers["RateLimit-Limit"] == "0.01"
    assert refused.headers["RateLimit-Remaining"] == "0"
    assert refused.headers["RateLimit-Reset"] == refused.headers["Retry-After"] == "100"

    metrics = client.get("/metrics").text
    assert _throttled(metrics, tenant["id"], "executions_per_second", "refused") == 1.0
    shown = client.get(f"/v1/tenants/{tenant['id']}", headers=ADMIN).json()
    assert shown["throttled"] == {"executions_per_second:refused": 1}

    sign_in(client, ADMIN_KEY)
    page = client.get(f"/console/tenants/{tenant['id']}")
    assert page.status_code == 200
    table = page.text.split('id="throttled"', 1)[1].split("</table>", 1)[0]
    assert "<td>executions_per_second</td><td>0</td><td>1</td>" in table


def test_a_delayed_request_says_it_was_delayed_and_it_is_counted(
    client: TestClient, new_tenant: Callable[..., dict[str, Any]]
) -> None:
    tenant = new_tenant(executions_per_second=0.5, burst=1)  # the second waits (~2 s)
    first, second = run(client, tenant["headers"]), run(client, tenant["headers"])
    assert (first.status_code, second.status_code) == (200, 200)
    assert "Corral-Throttled" not in first.headers
    assert second.headers["Corral-Throttled"].startswith("executions_per_second;waited=")
    assert second.headers["RateLimit-Limit"] == "0.5"
    metrics = client.get("/metrics").text
    assert _throttled(metrics, tenant["id"], "executions_per_second", "delayed") == 1.0
    shown = client.get(f"/v1/tenants/{tenant['id']}", headers=ADMIN).json()
    assert shown["throttled"] == {"executions_per_second:delayed": 1}
