"""``GET /v1/usage``: what a tenant's calls used and cost, grouped; the CSV says the same;
a tenant sees only its own, the operator everyone's and the platform's."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.app.api.v1.test_invocations import Tenant, run
from tests.conftest import ADMIN


def usage(client: TestClient, headers: dict[str, str], **params: Any) -> Any:
    response = client.get("/v1/usage", params=params, headers=headers)
    assert response.status_code == 200, response.text
    return response.json() if params.get("format") != "csv" else response.text


def settle(client: TestClient, headers: dict[str, str], events: int) -> dict[str, Any]:
    """The report once ``events`` are counted (results are stored as they come)."""
    deadline = time.monotonic() + 10
    while True:
        report = usage(client, headers, group_by="tenant")
        if report["total"]["events"] >= events or time.monotonic() > deadline:
            return report  # type: ignore[no-any-return]
        time.sleep(0.05)


def test_a_tenants_calls_are_counted_and_priced(
    client: TestClient, new_tenant: Callable[..., Tenant]
) -> None:
    tenant = new_tenant("usage-a")
    for _ in range(3):
        run(client, tenant, stdout="x" * 1000, cpu_ms=2000, peak_memory_kb=512 * 1024)
    run(client, tenant, exit=3, cpu_ms=1000)
    report = settle(client, tenant["headers"], 4)
    [row] = report["rows"]
    assert row["group"] == {"tenant": "usage-a"}
    assert (row["events"], row["failures"], row["retries"]) == (4, 1, 0)
    assert row["cpu_s"] == pytest.approx(7.0)
    assert row["bytes_out"] == 3000
    assert row["bytes_in"] > 0
    # 512 MB held for each run's exec time
    exec_s = row["exec_s"]
    assert exec_s > 0 and row["memory_gb_s"] > 0
    prices = client.app.state.services.settings.prices  # type: ignore[attr-defined]
    assert row["cost_cpu"] == pytest.approx(7.0 * prices.cpu_second)
    transfer = (row["bytes_in"] + row["bytes_out"]) / 1e9 * prices.gb_transferred
    # each call held its instance from its setup to its teardown
    held_s = row["setup_s"] + row["exec_s"] + row["teardown_s"]
    assert row["instance_hours"] == pytest.approx(held_s / 3600) and held_s > 0
    assert row["cost_transfer"] == pytest.approx(transfer)
    assert row["cost"] == pytest.approx(
        row["cost_cpu"] + row["cost_memory"] + row["cost_instances"] + row["cost_transfer"]
    )
    shares = [row[f"{p}_share"] for p in ("queue", "setup", "exec", "teardown")]
    assert sum(shares) == pytest.approx(1.0) and row["exec_share"] > 0
    assert report["total"]["events"] == 4 and report["currency"] == "USD"


def test_csv_and_json_say_the_same(client: TestClient, new_tenant: Callable[..., Tenant]) -> None:
    tenant = new_tenant("usage-csv")
    for i in range(5):
        run(client, tenant, cpu_ms=100 * (i + 1))
    settle(client, tenant["headers"], 5)
    report = usage(client, tenant["headers"], group_by="language,day")
    text = usage(client, tenant["headers"], group_by="language,day", format="csv")
    table = list(csv.DictReader(io.StringIO(text)))
    assert len(table) == len(report["rows"]) + 1  # and the total
    today = datetime.now(UTC).date().isoformat()
    first = table[0]
    assert (first["language"], first["day"]) == ("fake", today)
    row = report["rows"][0]
    for column in ("events", "cpu_s", "bytes_in", "bytes_out", "cost", "exec_share"):
        assert float(first[column]) == pytest.approx(float(row[column])), column
    assert table[-1]["language"] == "total"
    assert float(table[-1]["cost"]) == pytest.approx(report["total"]["cost"])


def test_rolled_up_and_pending_events_are_counted_once(
    client: TestClient, new_tenant: Callable[..., Tenant]
) -> None:
    """The reconciler rolls events up every 0.2 s here: whatever was rolled by the time
    of each read, the totals are the same."""
    tenant = new_tenant()
    for _ in range(6):
        run(client, tenant, cpu_ms=500)
    first = settle(client, tenant["headers"], 6)["total"]
    time.sleep(1.0)  # everything rolled up by now
    again = usage(client, tenant["headers"], group_by="tenant")["total"]
    assert (first["events"], first["cpu_s"]) == (again["events"], again["cpu_s"]) == (6, 3.0)


def test_a_tenant_sees_only_its_own_and_the_operator_sees_all(
    client: TestClient, new_tenant: Callable[..., Tenant]
) -> None:
    one, two = new_tenant("usage-one"), new_tenant("usage-two")
    run(client, one, cpu_ms=1000)
    run(client, two, cpu_ms=3000)
    run(client, two, cpu_ms=3000)
    settle(client, one["headers"], 1)
    settle(client, two["headers"], 2)
    mine = usage(client, one["headers"], group_by="tenant")
    assert [r["group"]["tenant"] for r in mine["rows"]] == ["usage-one"]
    asked = client.get("/v1/usage", params={"tenant": two["id"]}, headers=one["headers"])
    assert asked.status_code == 403 and asked.json()["error"]["code"] == "admin_required"
    everyone = usage(client, ADMIN, group_by="tenant")
    by_name = {r["group"]["tenant"]: r for r in everyone["rows"]}
    assert by_name["usage-one"]["cpu_s"] == pytest.approx(1.0)
    assert by_name["usage-two"]["cpu_s"] == pytest.approx(6.0)
    only_two = usage(client, ADMIN, group_by="tenant", tenant=two["id"])
    assert [r["group"]["tenant"] for r in only_two["rows"]] == ["usage-two"]


def test_a_range_is_whole_hours_and_excludes_other_hours(
    client: TestClient, new_tenant: Callable[..., Tenant]
) -> None:
    tenant = new_tenant()
    before = datetime.now(UTC)
    run(client, tenant, cpu_ms=1000)
    settle(client, tenant["headers"], 1)
    after = datetime.now(UTC)
    earlier = usage(
        client,
        tenant["headers"],
        group_by="hour",
        start=(before - timedelta(hours=5)).isoformat(),
        end=(before - timedelta(hours=2)).isoformat(),
    )
    assert earlier["rows"] == [] and earlier["total"]["events"] == 0
    report = usage(
        client, tenant["headers"], group_by="hour", start=before.isoformat(), end=after.isoformat()
    )
    floor = before.replace(minute=0, second=0, microsecond=0)
    assert datetime.fromisoformat(report["start"]) == floor
    assert datetime.fromisoformat(report["end"]) > after
    assert report["total"]["events"] == 1
    [row] = report["rows"]
    assert floor <= datetime.fromisoformat(row["group"]["hour"]) <= after


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"group_by": "colour"}, "unknown grouping"),
        ({"group_by": "day,day"}, "twice"),
        ({"group_by": ""}, "at least one"),
        ({"start": "2026-12-01T10:00:00+00:00", "end": "2026-12-01T09:00:00+00:00"}, "after"),
        ({"start": "2020-01-01T00:00:00+00:00", "end": "2026-01-01T00:00:00+00:00"}, "at most"),
        ({"start": "2026-12-01T10:00:00"}, "timezone"),
        ({"format": "xml"}, "format"),
    ],
)
def test_bad_queries_are_refused_with_a_stable_code(
    client: TestClient, new_tenant: Callable[..., Tenant], params: dict[str, str], message: str
) -> None:
    response = client.get("/v1/usage", params=params, headers=new_tenant()["headers"])
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert message in json.dumps(error)


def test_without_a_key_there_is_no_usage(client: TestClient) -> None:
    assert client.get("/v1/usage").status_code == 401


def test_instance_hours_are_priced_by_backend_and_idle_capacity_is_the_platforms(
    client: TestClient, new_tenant: Callable[..., Tenant]
) -> None:
    """A sandbox's hours and a warm pool's idle hours (as the metering pass and the pool
    reports append them) are priced at their backend's rate; the idle ones belong to
    the platform, which only the operator sees."""
    from app.db.models import UsageEvent

    tenant = new_tenant("usage-sandboxes")
    services = client.app.state.services  # type: ignore[attr-defined]
    now = datetime.now(UTC)

    async def append() -> None:
        async with services.sessions() as session, session.begin():
            for subject_id, owner, kind, runtime, seconds, memory in (
                ("sbx_1@1", tenant["id"], "sandbox", "crun", 7200.0, 1024.0 * 7200),
                ("sbx_2@1", tenant["id"], "sandbox", "qemu", 3600.0, 2048.0 * 3600),
                ("node:nsjail/python:1", None, "pool_idle", "nsjail", 1800.0, 64.0 * 1800),
            ):
                session.add(
                    UsageEvent(
                        occurred_at=now,
                        tenant_id=owner,
                        subject="sandbox" if owner else "pool",
                        subject_id=subject_id,
                        kind=kind,
                        runtime=runtime,
                        instance_seconds=seconds,
                        memory_mb_seconds=memory,
                    )
                )

    client.portal.call(append)  # type: ignore[union-attr]
    prices = services.settings.prices
    mine = usage(client, tenant["headers"], group_by="backend")
    by_backend = {r["group"]["backend"]: r for r in mine["rows"]}
    assert set(by_backend) == {"crun", "qemu"}  # the platform's idle pool is not the tenant's
    assert by_backend["crun"]["instance_hours"] == pytest.approx(2.0)
    assert by_backend["crun"]["cost_instances"] == pytest.approx(2 * prices.instance_hour["crun"])
    assert by_backend["qemu"]["cost_instances"] == pytest.approx(prices.instance_hour["qemu"])
    assert by_backend["qemu"]["memory_gb_s"] == pytest.approx(2 * 3600)
    # grouped by tenant, each backend's rate still applies to its own hours
    [row] = usage(client, tenant["headers"], group_by="tenant")["rows"]
    expected = 2 * prices.instance_hour["crun"] + prices.instance_hour["qemu"]
    assert row["cost_instances"] == pytest.approx(expected)
    everyone = usage(client, ADMIN, group_by="tenant,kind")
    idle = [r for r in everyone["rows"] if r["group"]["kind"] == "pool_idle"]
    assert [r["group"]["tenant"] for r in idle] == ["(platform)"]
    assert idle[0]["instance_hours"] == pytest.approx(0.5)
