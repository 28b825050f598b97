"""The overview over time: executions, errors and latency per interval, from known
invocation rows, on both databases (the interval of a row is computed in SQL)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.testclient import TestClient

from app.api.console import history
from app.db.models import Invocation
from tests.app.api.console.test_console import sign_in
from tests.conftest import ADMIN_KEY
from wire.ids import new_id

NOW = datetime(2026, 12, 5, 12, 30, 20, tzinfo=UTC)


def row(tenant_id: str, created: datetime, status: str, ms: float) -> Invocation:
    finished = created + timedelta(milliseconds=ms)
    return Invocation(
        id=new_id("inv"),
        tenant_id=tenant_id,
        kind="run",
        runtime="fake",
        language="fake",
        status=status,
        created_at=created,
        finished_at=finished,
        request={},
    )


def store(client: TestClient, rows: list[Invocation]) -> None:
    services = client.app.state.services  # type: ignore[attr-defined]

    async def write() -> None:
        async with services.sessions.begin() as session:
            session.add_all(rows)

    client.portal.call(write)  # type: ignore[union-attr]


def read(client: TestClient, tenant_id: str | None, span: str) -> dict[str, Any]:
    services = client.app.state.services  # type: ignore[attr-defined]

    async def series() -> dict[str, Any]:
        async with services.sessions() as session:
            return await history.series(
                session, tenant_id=tenant_id, span=history.SPANS[span], now=NOW
            )

    return client.portal.call(series)  # type: ignore[union-attr,no-any-return]


def test_the_series_counts_each_interval_and_its_percentiles(
    client: TestClient, new_tenant: Callable[..., dict[str, Any]]
) -> None:
    a, b = new_tenant()["id"], new_tenant()["id"]
    minute = NOW.replace(second=0)  # 12:30, the last interval of the hour
    rows = [
        # 12:30: ten of a's, 10..100 ms, one errored, one failed
        *(row(a, minute + timedelta(seconds=i), "succeeded", 10.0 * (i + 1)) for i in range(8)),
        row(a, minute + timedelta(seconds=9), "errored", 90.0),
        row(a, minute + timedelta(seconds=10), "failed", 100.0),
        # 12:00:59.5, the last moment of 12:00
        row(a, minute - timedelta(minutes=29, seconds=0.5), "succeeded", 5.0),
        # b's, at 12:29; and one of a's before the window (11:30:59) and after it
        row(b, minute - timedelta(minutes=1), "succeeded", 1000.0),
        row(a, minute - timedelta(minutes=59, seconds=1), "succeeded", 7.0),
        row(a, minute + timedelta(minutes=1), "succeeded", 7.0),
    ]
    store(client, rows)

    mine = read(client, a, "hour")
    assert mine["start"] == "2026-12-05T11:31:00+00:00" and len(mine["labels"]) == 60
    assert mine["labels"][0] == "11:31" and mine["labels"][-1] == "12:30"
    last, half = 59, 29  # 12:30, and 12:00
    assert mine["executions"][last] == 10
    assert (mine["errored"][last], mine["failed"][last]) == (1, 1)
    assert (mine["p50_ms"][last], mine["p99_ms"][last]) == (50.0, 100.0)
    assert mine["executions"][half] == 1 and mine["p50_ms"][half] == 5.0
    assert mine["executions"][half + 1] == 0 and mine["p50_ms"][half + 1] is None
    assert sum(mine["executions"]) == 11 and mine["p50_ms"][0] is None
    assert mine["sampled"] is False

    everyone = read(client, None, "hour")
    assert everyone["executions"][58] == 1 and everyone["p99_ms"][58] == 1000.0
    assert sum(everyone["executions"]) == 12

    day = read(client, a, "day")  # per 15 minutes: 12:30-12:45 is the last
    assert len(day["labels"]) == 96 and day["labels"][-1] == "12:30"
    assert day["executions"][-1] == 11  # 12:30's ten and 12:31's
    assert day["executions"][-3] == 1 and day["executions"][-5] == 1  # 12:00 and 11:30
    assert sum(day["executions"]) == 13


def test_the_overview_shows_the_hour_or_the_day(client: TestClient) -> None:
    sign_in(client, ADMIN_KEY)
    page = client.get("/console").text
    assert "Over the last hour" in page and 'id="history-data"' in page
    assert 'href="/console?span=day"' in page
    day = client.get("/console?span=day").text
    assert "Over the last day" in day and re.search(r"per 15 minutes", day)
