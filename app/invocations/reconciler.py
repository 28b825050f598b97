"""The reconciler: nothing accepted is lost, nothing is left open, on start-up too.

Three of the leader's jobs (``app.leader``), each run every ``reconcile_seconds`` in a
task of its own. ``judge`` looks at each invocation that has been open longer than
``reconcile_grace_seconds`` by its dispatch marker and the liveness of the nodes:

======================================  =============================================
what it finds                           verdict
======================================  =============================================
a marker claimed by a live node         running: leave it
... but open past its limits + grace    stuck: hand out again (or fail)
a marker claimed by a dead node         lost on that node: hand out again (or fail)
  (or by an earlier incarnation of it)
an unclaimed marker placed on a dead    lost in transit: hand out again
  node
an unclaimed marker on a live stream    waiting: leave it (the marker expires if no
                                        node ever takes it; a Job a dead node read
                                        from an overflow stream and never claimed is
                                        put back on it)
no marker, or one for an older claim    never sent (the gateway died or its dispatch
                                        failed), or Redis lost it: hand out again
======================================  =============================================

"Hand out again" is one compare-and-set on the row (``Reissue``: a new claim token,
one more attempt) followed by a dispatch of the Job the row keeps; from then on only the
new token can store a result, so an execution that runs twice says so in ``attempts``.
An execution that had started (a node claimed it) is failed instead, ``errored`` with a
reason beginning "lost:", once it has had ``max_attempts``; one that never started is
handed out up to ``max_attempts + NEVER_STARTED_EXTRA`` times.

``adopt`` records what dead gateways left on their results streams (their callers are
gone, the outcome is not) and ``dead_nodes`` puts back what dead nodes read and never
claimed; both forget gateways and nodes that have been dead without a break for
``FORGET_AFTER_S`` (one that reports again starts afresh).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker

from app.db import invocations
from app.db.models import utcnow
from app.db.writer import BatchWriter
from app.dispatch.transport import GatewayTransport
from app.invocations.recorder import Recorder
from app.invocations.service import Timing
from app.metrics import Metrics
from wire.ids import new_claim
from wire.messages import Job, Marker, NodeReport, Stored

log = logging.getLogger(__name__)

#: Extra hand-outs of an execution that no node ever started.
NEVER_STARTED_EXTRA = 3
#: Open invocations judged per pass.
BATCH = 2000
#: A gateway or node dead this long, every pass in between seeing it dead, is forgotten
#: (its streams deleted).
FORGET_AFTER_S = 600.0
#: Entries of dead gateways' results streams recorded per pass.
ADOPT_PER_PASS = 20
#: How often what a dead node read and never claimed is looked for (it scans every
#: tenant's overflow stream of the node's runtimes).
RELEASE_EVERY_S = 30.0


@dataclass(frozen=True, slots=True)
class Policy:
    grace_s: float  #: an invocation younger than this is not judged
    stuck_grace_s: float  #: a claimed execution open this long past its limits is stuck
    max_attempts: int
    timing: Timing


@dataclass
class Pass:
    """What one pass did (for metrics, logs and tests)."""

    judged: int = 0
    reissued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    adopted: int = 0
    released: int = 0  #: Jobs a dead node had read and not claimed, put back


@dataclass(frozen=True, slots=True)
class _Verdict:
    lost: bool
    started: bool = False
    reason: str = ""


_KEEP = _Verdict(lost=False)


class Reconciler:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[Any],
        writer: BatchWriter,
        transport: GatewayTransport,
        recorder: Recorder,
        metrics: Metrics,
        policy: Policy,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._sessions = sessions
        self._writer = writer
        self._transport = transport
        self._recorder = recorder
        self._metrics = metrics
        self._policy = policy
        self._clock = clock
        #: since when each gateway, and each node, has been seen dead without a break: an
        #: entry goes as soon as a pass no longer sees it dead (it reported again), so
        #: a node that missed one report long after an earlier gap is not forgotten
        self._gateway_dead_since: dict[str, float] = {}
        self._node_dead_since: dict[str, float] = {}
        self._released_at: dict[str, float] = {}

    async def reconcile(self) -> Pass:
        """The three jobs once, one after another (tests, and a caller that wants them
        together)."""
        done = await self.judge()
        done.adopted = (await self.adopt()).adopted
        done.released = (await self.dead_nodes()).released
        return done

    async def judge(self) -> Pass:
        """Judge the open invocations: hand out again, or fail, what is lost."""
        done = Pass()
        await self._judge(done, set(await self._transport.dead_gateways()))
        self._metrics.reconciler.labels("reissued").inc(len(done.reissued))
        self._metrics.reconciler.labels("failed").inc(len(done.failed))
        self._metrics.reconciler.labels("passes").inc()
        if done.reissued or done.failed:
            log.info(
                "reconciler: %d judged, %d handed out again, %d failed as lost",
                done.judged,
                len(done.reissued),
                len(done.failed),
            )
        return done

    async def adopt(self) -> Pass:
        """Record what dead gateways left; forget long-dead ones."""
        done = Pass()
        await self._adopt(done, set(await self._transport.dead_gateways()))
        if done.adopted:
            log.info("reconciler: %d results of dead gateways recorded", done.adopted)
        return done

    async def dead_nodes(self) -> Pass:
        """Put back what dead nodes read and never claimed; forget long-dead ones."""
        done = Pass()
        await self._dead_nodes(done)
        if done.released:
            log.info("reconciler: %d jobs put back from dead nodes", done.released)
        return done

    # --- open invocations ------------------------------------------------------------
    async def _judge(self, done: Pass, dead_gateways: set[str]) -> None:
        before = utcnow() - timedelta(seconds=self._policy.grace_s)
        async with self._sessions() as session:
            rows = await invocations.open_rows(session, before=before, limit=BATCH)
        if not rows:
            return
        done.judged = len(rows)
        markers = await self._transport.markers([row.id for row in rows])
        unmarked = [row.id for row in rows if _unmarked(row, markers.get(row.id))]
        async with self._sessions() as session:
            jobs = await invocations.jobs_of(session, unmarked)
        live = {node.node_id: node for node in await self._transport.catalogue()}
        now = self._clock()
        verdicts = {
            row.id: self._verdict(row, markers.get(row.id), jobs.get(row.id), live, now)
            for row in rows
        }
        lost = [row for row in rows if verdicts[row.id].lost]
        if not lost:
            return
        missing = [row.id for row in lost if row.id not in jobs]
        if missing:
            async with self._sessions() as session:
                jobs.update(await invocations.jobs_of(session, missing))
        for row in lost:
            verdict = verdicts[row.id]
            limit = self._policy.max_attempts + (0 if verdict.started else NEVER_STARTED_EXTRA)
            job_json = jobs.get(row.id)
            if job_json is None or row.attempts >= limit:
                reason = verdict.reason if job_json else "its dispatch intent is missing"
                await self._fail(
                    done, row, job_json, f"lost: {reason}; not run again", dead_gateways
                )
            else:
                await self._reissue(done, row, job_json, verdict.reason, dead_gateways)

    def _verdict(
        self,
        row: invocations.OpenRow,
        marker: Marker | None,
        job_json: str | None,
        live: dict[str, NodeReport],
        now: float,
    ) -> _Verdict:
        if marker is None or _unmarked(row, marker):
            if row.status != invocations.Status.RUNNING:
                return _Verdict(True, False, "its hand-out never reached a node")
            # Running, but its marker is gone (Redis lost it): while the node that started
            # it is up, in the same incarnation, and within its limits, its result may come.
            node = live.get(row.node_id or "")
            started = row.started_at.timestamp() if row.started_at else 0.0
            if node is not None and node.started_at <= started and job_json is not None:
                limit = (
                    Job.model_validate_json(job_json).deadline_seconds + self._policy.stuck_grace_s
                )
                if now - started <= limit:
                    return _KEEP
            return _Verdict(True, True, f"its hand-out on node {row.node_id} vanished")
        if marker.claimed_by is not None:
            node = live.get(marker.claimed_by)
            if node is None or node.incarnation != marker.incarnation:
                return _Verdict(True, True, f"node {marker.claimed_by} died running it")
            limit = marker.deadline_s + self._policy.stuck_grace_s
            if marker.claimed_at is not None and now - marker.claimed_at > limit:
                return _Verdict(
                    True, True, f"node {marker.claimed_by} did not finish it within {limit:g}s"
                )
            return _KEEP
        if marker.placed_on is not None and marker.placed_on not in live:
            return _Verdict(True, False, f"node {marker.placed_on} died before taking it")
        return _KEEP

    async def _reissue(
        self,
        done: Pass,
        row: invocations.OpenRow,
        job_json: str,
        reason: str,
        dead_gateways: set[str],
    ) -> None:
        claim = new_claim()
        taken = await self._writer.write(
            invocations.Reissue(invocation_id=row.id, claim=row.claim, new_claim=claim)
        )
        if not taken:  # stored or handed out meanwhile
            return
        previous = Job.model_validate_json(job_json)
        job = previous.model_copy(
            update={
                "claim": claim,
                "attempt": row.attempts + 1,
                "enqueued_at": self._clock(),
                "reply_to": self._reply_to(previous.reply_to, dead_gateways),
            }
        )
        log.warning("inv=%s %s: handing it out again (attempt %d)", row.id, reason, job.attempt)
        done.reissued.append(row.id)
        try:
            await self._transport.dispatch(
                job,
                node_id=None,
                hold_s=self._policy.timing.hold_s,
                queue_s=self._policy.timing.queue_s,
            )
        except Exception as exc:  # the next pass finds it without a marker and retries
            log.warning("inv=%s dispatch failed: %r", row.id, exc)

    async def _fail(
        self,
        done: Pass,
        row: invocations.OpenRow,
        job_json: str | None,
        reason: str,
        dead_gateways: set[str],
    ) -> None:
        stored = await self._writer.write(
            invocations.Fail(invocation_id=row.id, claim=row.claim, error=reason)
        )
        if not stored:
            return
        log.error("inv=%s %s (after %d attempts)", row.id, reason, row.attempts)
        done.failed.append(row.id)
        if job_json is not None:
            gateway = Job.model_validate_json(job_json).reply_to
            if gateway not in dead_gateways:
                try:
                    await self._transport.notify(gateway, Stored(invocation_id=row.id))
                except Exception as exc:  # its caller polls the row instead
                    log.info("inv=%s could not notify gateway %s: %r", row.id, gateway, exc)

    def _reply_to(self, gateway: str, dead_gateways: set[str]) -> str:
        return self._transport.gateway_id if gateway in dead_gateways else gateway

    # --- dead gateways and nodes -----------------------------------------------------
    async def _adopt(self, done: Pass, dead_gateways: set[str]) -> None:
        now = self._clock()
        _keep_only(self._gateway_dead_since, dead_gateways)
        for gateway in sorted(dead_gateways):
            drained = False
            for _ in range(ADOPT_PER_PASS):
                entries = await self._transport.adopt(gateway)
                if not entries:
                    drained = True
                    break
                await self._recorder.record(entries)
                done.adopted += len(entries)
            since = self._gateway_dead_since.setdefault(gateway, now)
            if drained and now - since > FORGET_AFTER_S:
                log.info(
                    "reconciler: forgetting gateway %s (dead since %.0fs)", gateway, now - since
                )
                await self._transport.forget_gateway(gateway)
                self._gateway_dead_since.pop(gateway, None)

    async def _dead_nodes(self, done: Pass) -> None:
        now = self._clock()
        runtimes: set[str] = set()
        for node in await self._transport.catalogue():
            runtimes.update(node.runtimes)
        dead = await self._transport.dead_nodes()
        _keep_only(self._node_dead_since, dead)
        _keep_only(self._released_at, dead)
        for node_id in dead:
            since = self._node_dead_since.setdefault(node_id, now)
            if now - self._released_at.get(node_id, 0.0) >= RELEASE_EVERY_S:
                done.released += await self._transport.release(node_id, sorted(runtimes))
                self._released_at[node_id] = now
            if now - since > FORGET_AFTER_S:
                log.info("reconciler: forgetting node %s (dead since %.0fs)", node_id, now - since)
                await self._transport.forget_node(node_id, sorted(runtimes))
                self._node_dead_since.pop(node_id, None)
                self._released_at.pop(node_id, None)


def _keep_only(seen: dict[str, float], ids: Collection[str]) -> None:
    """Drop what ``seen`` holds for ids that are not in ``ids`` any more."""
    for gone in seen.keys() - set(ids):
        del seen[gone]


def _unmarked(row: invocations.OpenRow, marker: Marker | None) -> bool:
    """No marker of the row's current claim: never sent, or Redis lost it."""
    return marker is None or marker.claim != row.claim
