"""The leader: one gateway runs the cluster's housekeeping, as named jobs.

Leadership is held as ``app.invocations.leader`` elects it (a PostgreSQL advisory lock,
or a ``flock`` beside the SQLite file); ``Leader.run`` asks for it every
``check_every_s`` and, while this gateway holds it, runs each ``LeaderJob`` in a task of
its own, started every ``period_s`` (start to start; a run longer than its period is
followed at once by the next). So a slow job, a node inventory that hangs say, never
delays another: judging invocations goes on at its own period whatever the sandbox sync
is doing. Losing the lead cancels every job's task; the next leader starts them afresh
(every job is safe to run twice at once: the writes are compare-and-set).

The jobs of a gateway (``app.services``): ``invocations`` (judge open invocations, hand
lost ones out again: ``app.invocations.reconciler``), ``gateways`` (record what dead
gateways left, forget long-dead ones), ``nodes`` (put back what dead nodes read, forget
long-dead ones), ``rollups`` (usage events into hourly rollups), ``retention``,
``storage`` (metering what tenants keep) and ``sandboxes`` (the sandbox records against
the nodes' inventories). Each job's runs, failures, last start, duration and error are
kept in ``JobStatus``, counted in ``corral_leader_job_runs_total`` and
``corral_leader_job_seconds``, and shown by ``GET /v1/admin/leader``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker

from app.db import usage
from app.db.models import utcnow
from app.invocations.leader import Election
from app.invocations.reconciler import Reconciler
from app.invocations.retention import Retention, sweep
from app.metrics import Metrics
from app.settings import Settings
from app.usage import storage

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LeaderJob:
    name: str
    period_s: float
    run: Callable[[], Awaitable[Any]]
    what: str = ""


@dataclass(slots=True)
class JobStatus:
    """What one job did while this gateway led."""

    name: str
    period_s: float
    what: str
    runs: int = 0
    failures: int = 0
    running: bool = False
    last_started_at: datetime | None = None
    last_duration_s: float | None = None
    last_error: str | None = None  #: of the last run (None: it succeeded)


@dataclass
class Leader:
    election: Election
    jobs: list[LeaderJob]
    metrics: Metrics
    check_every_s: float
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    leading: bool = False
    status: dict[str, JobStatus] = field(default_factory=dict)
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [job.name for job in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError(f"leader jobs must have distinct names: {names}")
        self.status = {job.name: JobStatus(job.name, job.period_s, job.what) for job in self.jobs}

    async def run(self) -> None:
        """Take the lead when it is free and run the jobs while it is held."""
        try:
            while True:
                try:
                    leading = await self.election.lead()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("leader: could not tell whether this gateway leads: %r", exc)
                    leading = False
                if leading and not self._tasks:
                    self._start()
                elif not leading and self._tasks:
                    log.warning("leader: lost the lead; stopping its jobs")
                    await self._stop()
                self.leading = leading
                await self.sleep(self.check_every_s)
        finally:
            await self._stop()
            self.leading = False

    def _start(self) -> None:
        log.info("leader: this gateway leads: %s", ", ".join(j.name for j in self.jobs))
        for job in self.jobs:
            self._tasks[job.name] = asyncio.create_task(
                self._loop(job), name=f"corral-leader-{job.name}"
            )

    async def _stop(self) -> None:
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for status in self.status.values():
            status.running = False

    async def _loop(self, job: LeaderJob) -> None:
        status = self.status[job.name]
        while True:
            started = self.clock()
            status.running, status.last_started_at = True, utcnow()
            outcome = "ok"
            try:
                await job.run()
                status.last_error = None
            except asyncio.CancelledError:
                outcome = "cancelled"
                raise
            except Exception as exc:
                outcome = "failed"
                status.failures += 1
                status.last_error = repr(exc)
                log.warning("leader: job %s failed: %r", job.name, exc)
            finally:
                took = self.clock() - started
                status.running, status.runs, status.last_duration_s = False, status.runs + 1, took
                self.metrics.leader_runs.labels(job.name, outcome).inc()
                self.metrics.leader_seconds.labels(job.name).observe(took)
            await self.sleep(max(0.0, job.period_s - took))


def gateway_jobs(
    *,
    reconciler: Reconciler,
    sessions: async_sessionmaker[Any],
    retention: Retention,
    sandbox_sync: Callable[[], Awaitable[None]],
    settings: Settings,
) -> list[LeaderJob]:
    """The leader's jobs, with their periods: the whole table, in one place."""
    every = settings.reconcile_seconds

    async def roll_up() -> None:
        async with sessions.begin() as session:
            await usage.roll_up(session)

    async def sweep_retention() -> None:
        await sweep(sessions, retention, utcnow())

    async def meter_storage() -> None:
        every_s = settings.storage_meter_seconds
        await storage.meter(sessions, now=utcnow(), every_s=every_s)

    return [
        LeaderJob("invocations", every, reconciler.judge, "judge open invocations"),
        LeaderJob("gateways", every, reconciler.adopt, "record dead gateways' results"),
        LeaderJob("nodes", every, reconciler.dead_nodes, "put back dead nodes' reads"),
        LeaderJob("rollups", every, roll_up, "usage events into hourly rollups"),
        LeaderJob("retention", settings.retention_seconds, sweep_retention, "delete the old"),
        LeaderJob("storage", settings.storage_meter_seconds, meter_storage, "meter storage"),
        LeaderJob(
            "sandboxes", settings.sandbox_sync_seconds, sandbox_sync, "sandbox records vs nodes"
        ),
    ]
