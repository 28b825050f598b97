"""An in-process ``WorkerFactory`` and a manual clock, for unit tests of the pool.

``FakeFactory`` starts ``FakeWorker`` objects: a start waits for ``gate`` (open by
default; close it to keep starts in flight), and for ``gates[key]`` if its key has one
(to hold one key's starts only), counts itself in ``in_flight`` meanwhile, advances
``clock`` by ``start_s`` (so the pool measures that start time), and fails with
``fail_with`` when set. It records every start attempt, stop and adoption, so tests can
count them.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from node.pools.worker import WorkerFactory

_ids = itertools.count(1)


class ManualClock:
    """A clock that moves only when told: ``clock()`` reads it, ``advance(s)`` moves it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass(eq=False)
class FakeWorker:
    key: str
    memory: float = 10.0
    id: str = field(default_factory=lambda: f"fake-{next(_ids)}")
    healthy: bool = True
    stopped: bool = False


class FakeFactory(WorkerFactory[FakeWorker]):
    def __init__(
        self,
        *,
        one_shot: bool = False,
        memory_mb: float = 10.0,
        clock: ManualClock | None = None,
        start_s: float = 0.0,
        start_cpu_ms: float = 0.0,
    ) -> None:
        self.one_shot = one_shot
        self.memory = memory_mb
        self.clock = clock
        self.start_s = start_s
        self.start_cpu = start_cpu_ms
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_with: BaseException | None = None
        self.attempts: list[str] = []  #: keys of every start attempt
        self.started: list[FakeWorker] = []  #: workers that became ready
        self.stopped: list[FakeWorker] = []
        self.adopted: list[tuple[str, str]] = []  #: (worker id, new key)
        self.checks_fail: set[str] = set()  #: worker ids whose next check fails
        self.gates: dict[str, asyncio.Event] = {}  #: per key, closed: its starts wait
        self.in_flight: dict[str, int] = {}  #: starts of each key running now
        self.most_in_flight: dict[str, int] = {}  #: the most at once, per key
        self.most_in_flight_total = 0  #: the most at once over all keys

    async def start(self, key: str) -> FakeWorker:
        self.attempts.append(key)
        self.in_flight[key] = self.in_flight.get(key, 0) + 1
        self.most_in_flight[key] = max(self.most_in_flight.get(key, 0), self.in_flight[key])
        total = sum(self.in_flight.values())
        self.most_in_flight_total = max(self.most_in_flight_total, total)
        try:
            await self.gate.wait()
            if key in self.gates:
                await self.gates[key].wait()
        finally:
            self.in_flight[key] -= 1
        if self.clock is not None:
            self.clock.advance(self.start_s)
        if self.fail_with is not None:
            raise self.fail_with
        worker = FakeWorker(key, memory=self.memory)
        self.started.append(worker)
        return worker

    async def stop(self, worker: FakeWorker) -> None:
        if not worker.stopped:
            worker.stopped = True
            self.stopped.append(worker)

    def alive(self, worker: FakeWorker) -> bool:
        return worker.healthy and not worker.stopped

    async def check(self, worker: FakeWorker) -> bool:
        if worker.id in self.checks_fail:
            self.checks_fail.discard(worker.id)
            return False
        return self.alive(worker)

    def memory_mb(self, worker: FakeWorker) -> float:
        return worker.memory

    def start_cpu_ms(self, worker: FakeWorker) -> float:
        return self.start_cpu

    def adopt(self, worker: FakeWorker, key: str) -> None:
        worker.key = key
        self.adopted.append((worker.id, key))

    @property
    def live(self) -> list[FakeWorker]:
        """Started and not stopped."""
        return [worker for worker in self.started if not worker.stopped]
