"""The leader's scheduler: each named job in a task of its own, at its own period, so a
job that hangs (a node inventory that never answers) never delays another, judging
invocations above all; jobs run only while the lead is held; every job's runs, duration
and last error are shown (``GET /v1/admin/leader``, metrics)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.invocations.leader import Election
from app.leader import Leader, LeaderJob
from app.main import create_app
from app.metrics import Metrics
from app.sandboxes.service import Sandboxes
from app.settings import Settings
from tests.conftest import ADMIN


class Lead(Election):
    def __init__(self) -> None:
        self.held = True

    async def lead(self) -> bool:
        return self.held

    async def close(self) -> None:
        return None


async def until(condition: Callable[[], bool], *, deadline_s: float = 20.0) -> None:
    """Let the loop run until ``condition`` holds (a deadline, not a measurement)."""
    give_up = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < give_up, "the condition never held"
        await asyncio.sleep(0.01)


async def test_each_job_waits_its_own_period_from_start_to_start() -> None:
    now = [0.0]
    asked: list[float] = []

    async def sleep(seconds: float) -> None:
        asked.append(seconds)
        await asyncio.sleep(0)

    async def slow() -> None:
        now[0] += 2.0  # takes 2 s of its 5 s period

    async def quick() -> None:
        return None

    leader = Leader(
        election=Lead(),
        jobs=[LeaderJob("slow", 5.0, slow), LeaderJob("quick", 7.0, quick)],
        metrics=Metrics(),
        check_every_s=999.0,
        clock=lambda: now[0],
        sleep=sleep,
    )
    task = asyncio.create_task(leader.run())
    await until(lambda: all(s.runs >= 3 for s in leader.status.values()))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert set(asked) == {999.0, 3.0, 7.0}  # a job's own duration counts in its period
    assert leader.status["slow"].last_duration_s == 2.0
    assert leader.status["quick"].last_duration_s == 0.0


async def test_a_job_that_hangs_delays_no_other_and_a_failure_is_shown() -> None:
    judged: list[int] = []

    async def judge() -> None:
        judged.append(1)

    async def hang() -> None:
        await asyncio.Event().wait()

    async def fail() -> None:
        raise RuntimeError("the node inventory is broken")

    election = Lead()
    leader = Leader(
        election=election,
        jobs=[
            LeaderJob("sandboxes", 0.01, hang),
            LeaderJob("invocations", 0.01, judge),
            LeaderJob("storage", 0.01, fail),
        ],
        metrics=Metrics(),
        check_every_s=0.01,
    )
    task = asyncio.create_task(leader.run())
    await until(lambda: len(judged) >= 5 and leader.status["storage"].failures >= 2)
    hung = leader.status["sandboxes"]
    assert (hung.running, hung.runs) == (True, 0)
    assert leader.status["storage"].last_error == "RuntimeError('the node inventory is broken')"
    assert leader.leading

    election.held = False  # the lead is lost: every job stops, the hung one too
    await until(lambda: not leader.leading)
    stopped = len(judged)
    await asyncio.sleep(0.05)
    assert len(judged) == stopped and not hung.running
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_jobs_must_have_distinct_names() -> None:
    async def nothing() -> None:
        return None

    with pytest.raises(ValueError, match="distinct"):
        Leader(
            election=Lead(),
            jobs=[LeaderJob("x", 1.0, nothing), LeaderJob("x", 2.0, nothing)],
            metrics=Metrics(),
            check_every_s=1.0,
        )


def _passes(client: TestClient) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith('corral_reconciler_total{action="passes"}'):
            return float(line.split()[-1])
    return 0.0


def test_a_sandbox_sync_that_hangs_does_not_hold_up_invocation_reconciliation(
    make_settings: Callable[..., Settings], stack: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a gateway: its sandbox sync never returns (a node that never answers), yet
    judging invocations goes on pass after pass."""

    async def hangs(self: Sandboxes) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(Sandboxes, "sync", hangs)
    settings = make_settings(reconcile_seconds=0.05, sandbox_sync_seconds=0.05, **stack)
    with TestClient(create_app(settings)) as client:
        give_up = time.monotonic() + 30
        while _passes(client) < 5:
            assert time.monotonic() < give_up, f"only {_passes(client)} passes"
            time.sleep(0.05)
        shown = client.get("/v1/admin/leader", headers=ADMIN)
        tenant = client.post("/v1/tenants", json={"name": "nl"}, headers=ADMIN).json()
        refused = client.get(
            "/v1/admin/leader", headers={"Authorization": f"Bearer {tenant['key']['api_key']}"}
        )
    assert shown.status_code == 200, shown.text
    body = shown.json()
    jobs = {job["name"]: job for job in body["jobs"]}
    assert body["leading"] is True
    assert set(jobs) == {
        "invocations",
        "gateways",
        "nodes",
        "rollups",
        "retention",
        "storage",
        "sandboxes",
    }
    assert (jobs["sandboxes"]["running"], jobs["sandboxes"]["runs"]) == (True, 0)
    assert jobs["invocations"]["runs"] >= 5 and jobs["invocations"]["last_error"] is None
    assert jobs["invocations"]["period_s"] == 0.05
    assert jobs["retention"]["period_s"] == settings.retention_seconds
    assert refused.status_code == 403
