"""``Pool``: warm workers per key, sized from measured demand, shared by every backend.

A backend supplies a ``WorkerFactory`` (how to start, check, adopt and stop a worker)
and a ``PoolConfig``; the pool does the rest:

* **A pool per key.** Workers are kept per string key (``wire.messages.pool_key``) and
  only ever handed out for their own key. ``acquire(key, spare=...)`` takes an idle worker
  of ``key`` (most recently used first), else one of the ``spare`` key, which the factory
  ``adopt``-s into ``key`` for good (nsjail binds a spare jail to a tenant).
* **Sizing** (``sizing``): each key's target is
  ``clamp(ceil(arrival rate * start time * (1 + headroom)), min, max)``. A refill task
  starts workers in the background while a key's supply (idle + starting, + busy for
  reusable workers) is below its target, backing off exponentially after failed starts.
  At most ``start_concurrency`` starts no caller waits for run at once; a background
  start a caller comes to wait for stops counting, so the next one can begin (the refill
  keeps ahead of a steady stream of calls). Live plus starting workers never exceed
  ``max_workers``.
* **Merged cold starts.** An acquire that finds nothing waits in the key's queue; a start
  is launched only while waiters outnumber the key's starts in flight. A worker that
  becomes ready, or is released, goes to the oldest waiter, else to idle. A waiter that
  gives up (cancelled, timed out) leaves its start running: the worker goes to the next
  waiter or to idle. Starts run in the pool's own tasks, bounded by ``start_timeout_s``,
  never in the caller's. When the pool is full a start evicts the least recently used
  idle worker of another key (surplus ones first).
* **Bounded starts, in turns.** At most ``max_starting`` starts are in flight over all
  keys and ``max_starting_per_key`` for one key (one tenant's workers). A key whose
  waiters need starts it cannot have now queues for them; as starts finish, the next
  goes to the queued key with the fewest workers (``_serve_queue``), and a spare that
  becomes ready to the waiting key with the fewest workers. So a tenant's burst grows
  its own pool a few workers at a time and its calls wait for those or for its workers'
  releases: the growth costs that tenant's latency, while another key (a new tenant
  first) gets the next start. Background starts leave one of the node's starts to
  callers.
* **Reaper**: idle workers above their key's target are stopped once idle for
  ``idle_timeout_s``; dead ones, and reusable ones past ``max_age_s``, are recycled.
* **Accounting** (``accounting``): per key, idle workers and their memory integrated
  over time, starts and cold starts (a caller waited), reported by ``idle_capacity()``.

One-shot workers (``WorkerFactory.one_shot``) serve exactly one call: ``release`` stops
them, and their replacement waits up to ``refill_delay_s`` for that call to end.
Everything runs on one event loop; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from node.pools.accounting import IdleCapacity
from node.pools.config import PoolConfig
from node.pools.errors import PoolClosed, PoolExhausted, StartFailed
from node.pools.keys import Entry, KeyState
from node.pools.sizing import Bounds, StartTime
from node.pools.worker import Worker, WorkerFactory

logger = logging.getLogger(__name__)


class Pool[W: Worker]:
    def __init__(
        self,
        factory: WorkerFactory[W],
        config: PoolConfig,
        *,
        name: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._factory = factory
        self._config = config
        self._clock = clock
        self._one_shot = factory.one_shot
        self._keys: dict[str, KeyState[W]] = {}
        self._declared: set[str] = set()
        self._entries: dict[W, Entry[W]] = {}  #: every ready worker, idle or busy
        self._starting = 0
        self._starting_keys: set[str] = set()  #: keys with starts in flight
        self._start_time = StartTime()  #: over all keys, for keys without their own
        self._dirty: set[str] = set()  #: keys the refill task should look at
        #: keys whose waiters need starts they could not have yet (the start bounds, or a
        #: full pool), in the order they take turns (``_serve_queue``)
        self._queued: dict[str, None] = {}
        self._spare_keys: set[str] = set()  #: keys named as a spare by some acquire
        self._due: dict[str, float] = {}  #: key -> clock time to look at it again
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()  #: a start finished (``start()`` waits on it)
        self._unreported: dict[str, IdleCapacity] = {}  #: of keys forgotten by the reaper
        self._start_tasks: set[asyncio.Task[None]] = set()
        self._stops: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._closed = False
        self._closing: asyncio.Future[None] | None = None

    # --- gauges ---------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict[str, int]:
        """``{"warm": idle workers, "busy": handed out, "starting": starts in flight}``."""
        warm = sum(len(state.idle) for state in self._keys.values())
        busy = sum(len(state.busy) for state in self._keys.values())
        return {"warm": warm, "busy": busy, "starting": self._starting}

    def inventory(self) -> dict[str, int]:
        """Idle warm workers per key (keys with none are left out)."""
        return {name: len(state.idle) for name, state in self._keys.items() if state.idle}

    def idle_capacity(self) -> dict[str, IdleCapacity]:
        """Per key, the idle capacity held and the starts made since the previous call."""
        taken, self._unreported = self._unreported, {}
        for name, state in self._keys.items():
            cap = taken.setdefault(name, IdleCapacity())
            cap += state.meter.take()
        return {
            name: cap
            for name, cap in taken.items()
            if cap.instance_seconds or cap.memory_mb_seconds or cap.starts
        }

    def workers(self) -> list[W]:
        """Every ready worker, idle or busy (for tests and diagnostics)."""
        return list(self._entries)

    def target(self, key: str) -> int:
        """The number of workers ``key`` should have now (0 for an unknown key)."""
        state = self._keys.get(key)
        return self._target(state, self._clock()) if state is not None else 0

    # --- life cycle -----------------------------------------------------------------------
    def declare(self, key: str, bounds: Bounds) -> None:
        """Give ``key`` its own bounds; declared keys are warmed by ``start()`` and never
        forgotten. Other keys get ``PoolConfig.default_bounds`` when first acquired."""
        state = self._state(key)
        state.bounds = bounds
        self._declared.add(key)
        if self._loops:
            self._poke(key)

    async def start(self) -> None:
        """Start the background tasks, then warm every declared key to its minimum.

        Returns when each declared key has its minimum of idle workers (or cannot get
        them: the pool is full); if a start failed, raises the first failure. The caller
        closes the pool after a failed start.
        """
        if self._loops or self._closed:
            raise RuntimeError(f"pool {self.name}: start() may be called once, before close()")
        self._loops = [
            asyncio.create_task(self._refill_loop(), name=f"{self.name}-pool-refill"),
            asyncio.create_task(self._reap_loop(), name=f"{self.name}-pool-reaper"),
        ]
        for key in self._declared:
            self._poke(key)
        while not self._closed:
            self._changed.clear()
            failed = [self._keys[key] for key in sorted(self._declared) if self._keys[key].failures]
            if failed:
                error = failed[0].last_error
                assert error is not None
                raise error
            if all(self._warmed(self._keys[key]) for key in self._declared):
                return
            await self._changed.wait()
        raise PoolClosed(f"pool {self.name} closed while starting")

    def _warmed(self, state: KeyState[W]) -> bool:
        if len(state.idle) >= state.bounds.min:
            return True
        return state.starting == 0 and self._room() <= 0

    async def close(self) -> None:
        """Stop every worker, idle, busy or starting, and the background tasks. Waiting
        acquires fail with ``PoolClosed``. Idempotent."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for state in self._keys.values():
            while state.waiters:
                waiter = state.waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(PoolClosed(f"the {self.name} pool is closed"))
        tasks = [*self._loops, *self._start_tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        workers = list(self._entries)
        self._entries.clear()
        for state in self._keys.values():
            state.clear_idle()
            state.busy.clear()
            state.deferred.clear()
        await asyncio.gather(
            *(self._factory.stop(worker) for worker in workers),
            *list(self._stops),
            return_exceptions=True,
        )
        logger.info("pool %s closed: %d workers stopped", self.name, len(workers))

    # --- acquire / release ----------------------------------------------------------------
    async def acquire(self, key: str, *, spare: str | None = None, context: str = "") -> W:
        """A worker of ``key`` for one call (``context`` names the call in log lines).

        Takes an idle worker of ``key``, else adopts one of ``spare``, else waits for a
        start (merged with other waiters of ``key``) or a release. Raises ``PoolClosed``,
        ``PoolExhausted`` after ``acquire_timeout_s``, or the failure of the start it
        waited for. The caller must ``release`` the worker.
        """
        if self._closed:
            raise PoolClosed(f"the {self.name} pool is closed")
        now = self._clock()
        state = self._state(key)
        state.sizing.arrived(now)
        if spare is not None and state.spare != spare:
            state.spare = spare
            self._spare_keys.add(spare)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.acquire_timeout_s
        spare_counted = False
        while True:
            entry = self._take_idle(state, now)
            if entry is None and spare is not None:
                spare_state = self._state(spare)
                if not spare_counted:
                    spare_state.sizing.arrived(now)
                    spare_counted = True
                    self._poke(spare)
                entry = self._take_idle(spare_state, now)
                if entry is not None:
                    spare_state.busy.discard(entry)
                    self._adopt(entry, state)
                    state.busy.add(entry)
            if entry is None:
                entry = await self._wait(state, deadline, context)
            try:
                usable = await self._factory.check(entry.worker)
            except BaseException:
                self._retire(entry, "cancelled while checking it", context)
                raise
            now = self._clock()
            if self._closed:
                raise PoolClosed(f"the {self.name} pool is closed")
            if usable:
                return self._hand_out(entry, state, now, context)
            self._retire(entry, "it failed its check", context)

    def release(
        self, worker: W, *, reusable: bool = True, reason: str | None = None, context: str = ""
    ) -> None:
        """Give back a worker after its call. A reusable worker goes to the oldest waiter
        of its key or to idle, unless ``reusable`` is False (``reason`` says why), it died,
        or it is worn out; then it is stopped. A one-shot worker is always stopped."""
        entry = self._entries.get(worker)
        if entry is None:  # the pool closed meanwhile, or it was retired already
            return
        state = self._keys[entry.key]
        state.busy.discard(entry)
        if self._one_shot:
            state.deferred.discard(entry)
            self._retire(entry, None, context)
            return
        why = self._retire_reason(entry, reusable, reason)
        if why is not None:
            self._retire(entry, why, context)
            return
        self._deliver(entry, self._clock())
        if self._queued:
            self._wake.set()  # a key waiting for room may evict it now

    # --- maintenance ----------------------------------------------------------------------
    def reap(self) -> None:
        """Recycle dead and old idle workers, stop idle workers above their key's target
        that have been idle for ``idle_timeout_s``, and forget keys with nothing left."""
        now = self._clock()
        for name, state in list(self._keys.items()):
            for entry in list(state.idle):
                why = self._worn(entry, now)
                if why is not None:
                    state.remove_idle(entry)
                    self._retire(entry, why)
            target = self._target(state, now)
            surplus = state.supply(now, one_shot=self._one_shot) - target
            for entry in list(state.idle)[: max(0, surplus)]:  # longest idle first
                idle_for = now - entry.idle_since
                if idle_for < self._config.idle_timeout_s:
                    break
                state.remove_idle(entry)
                self._retire(entry, f"idle for {idle_for:.0f}s above the target of {target}")
            if state.supply(now, one_shot=self._one_shot) < target:
                self._poke(name)
            elif state.empty and target == 0 and name not in self._declared:
                cap = self._unreported.setdefault(name, IdleCapacity())
                cap += state.meter.take()
                del self._keys[name]

    # --- internals: taking and giving -----------------------------------------------------
    def _state(self, key: str) -> KeyState[W]:
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = KeyState(
                key,
                self._config.default_bounds,
                window_s=self._config.demand_window_s,
                clock=self._clock,
            )
        return state

    def _take_idle(self, state: KeyState[W], now: float) -> Entry[W] | None:
        while state.idle:
            entry = state.pop_idle()
            why = self._worn(entry, now)
            if why is None:
                state.busy.add(entry)
                return entry
            self._retire(entry, why)
        return None

    def _adopt(self, entry: Entry[W], state: KeyState[W]) -> None:
        """Move a spare's entry (in no busy or idle set) to ``state`` for good."""
        self._factory.adopt(entry.worker, state.name)
        entry.key = state.name
        logger.debug("pool %s: %s adopted by %s", self.name, entry.worker.id, state.name)

    def _hand_out(self, entry: Entry[W], state: KeyState[W], now: float, context: str) -> W:
        entry.uses += 1
        if self._one_shot and self._config.refill_delay_s > 0:
            entry.defer_until = now + self._config.refill_delay_s
            state.deferred.add(entry)
            self._wake_at(state.name, entry.defer_until)
        if state.supply(now, one_shot=self._one_shot) < self._target(state, now):
            self._poke(state.name)
        logger.debug(
            "pool %s%s: %s handed out (use %d)",
            state.name,
            _tag(context),
            entry.worker.id,
            entry.uses,
        )
        return entry.worker

    async def _wait(self, state: KeyState[W], deadline: float, context: str) -> Entry[W]:
        """Queue for the next worker of ``state``, starting one if no start is meant for
        this waiter."""
        waiter: asyncio.Future[Entry[W]] = asyncio.get_running_loop().create_future()
        state.waiters.append(waiter)
        logger.info(
            "pool %s%s: no warm worker, waiting (%d waiting, %d starting)",
            state.name,
            _tag(context),
            len(state.waiters),
            state.starting,
        )
        self._launch_for_waiters(state)
        self._poke(state.name)  # a start it waits for no longer counts as background
        try:
            async with asyncio.timeout_at(deadline):
                return await waiter
        except BaseException as exc:
            self._give_up(state, waiter)
            if isinstance(exc, TimeoutError):  # start timeouts reach waiters as StartFailed
                raise PoolExhausted(
                    f"no {state.name} worker within {self._config.acquire_timeout_s:g}s "
                    f"({self._describe_full()})"
                ) from None
            raise

    def _give_up(self, state: KeyState[W], waiter: asyncio.Future[Entry[W]]) -> None:
        """A waiter left: a worker already handed to it goes to the next one."""
        if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
            entry = waiter.result()
            if entry.worker in self._entries:
                self._keys[entry.key].busy.discard(entry)
                self._deliver(entry, self._clock())
            return
        with contextlib.suppress(ValueError):
            state.waiters.remove(waiter)
        waiter.cancel()

    def _deliver(self, entry: Entry[W], now: float) -> bool:
        """Hand a ready worker to the oldest waiter of its key, else (a spare) to a key
        waiting with it as its spare, else make it idle. True if a waiter took it."""
        state = self._keys[entry.key]
        if self._give_to_waiter(state, entry):
            return True
        if entry.key in self._spare_keys:
            waiting = [
                other for other in self._keys.values() if other.spare == entry.key and other.waiters
            ]
            if waiting:  # the key with the fewest workers: a new tenant before a grown one
                other = min(waiting, key=lambda k: len(k.busy) + len(k.idle) + k.starting)
                self._adopt(entry, other)
                if self._give_to_waiter(other, entry):
                    return True
                state = other
        entry.memory_mb = self._factory.memory_mb(entry.worker)
        state.push_idle(entry, now)
        return False

    def _give_to_waiter(self, state: KeyState[W], entry: Entry[W]) -> bool:
        while state.waiters:
            waiter = state.waiters.popleft()
            if not waiter.done():
                state.busy.add(entry)
                waiter.set_result(entry)
                return True
        return False

    def _retire_reason(self, entry: Entry[W], reusable: bool, reason: str | None) -> str | None:
        if not reusable:
            return reason or "the call left it unusable"
        if self._closed:
            return "the pool is closed"
        if self._config.max_uses is not None and entry.uses >= self._config.max_uses:
            return f"reached {entry.uses} uses"
        return self._worn(entry, self._clock())

    def _worn(self, entry: Entry[W], now: float) -> str | None:
        if not self._factory.alive(entry.worker):
            return "it died"
        max_age = self._config.max_age_s
        if max_age is not None and now - entry.started_at >= max_age:
            return "too old"
        return None

    def _retire(self, entry: Entry[W], why: str | None, context: str = "") -> None:
        """Forget a worker now (freeing its slot) and stop it in the background. ``why``
        is None for the normal end of a one-shot worker."""
        if self._entries.pop(entry.worker, None) is None:
            return
        state = self._keys[entry.key]
        state.busy.discard(entry)
        state.deferred.discard(entry)
        if why is not None:
            logger.info(
                "pool %s%s: stopping %s: %s", entry.key, _tag(context), entry.worker.id, why
            )
        self._spawn_stop(entry.worker)
        self._poke(entry.key)

    def _spawn_stop(self, worker: W) -> None:
        task = asyncio.create_task(self._stop(worker))
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    async def _stop(self, worker: W) -> None:
        try:
            await self._factory.stop(worker)
        except Exception:
            logger.exception("pool %s: stopping %s failed", self.name, worker.id)

    # --- internals: starting --------------------------------------------------------------
    def _room(self) -> int:
        cap = self._config.max_workers
        if cap is None:
            return 1 << 30
        return cap - len(self._entries) - self._starting

    def _describe_full(self) -> str:
        stats = self.stats()
        return f"{stats['busy']} busy, {stats['starting']} starting, {stats['warm']} idle"

    def _target(self, state: KeyState[W], now: float) -> int:
        return state.sizing.target(
            now,
            state.bounds,
            headroom=self._config.headroom,
            floor_rate=self._config.floor_rate,
            fallback_start_s=self._start_time.value,
        )

    def _launch_for_waiters(self, state: KeyState[W]) -> None:
        """Queue the key for starts while its waiters outnumber its starts in flight, and
        hand out the starts that can begin now. (A spare that becomes ready meanwhile goes
        to such a waiter: ``_deliver``.)"""
        if state.unserved > 0 and not self._closed:
            self._queued.setdefault(state.name, None)
        self._serve_queue()

    def _may_start(self, state: KeyState[W], *, background: bool = False) -> bool:
        """Whether the start bounds let ``state`` begin one more start now. A background
        start leaves the last of the pool's starts to callers."""
        per_key = self._config.max_starting_per_key
        if per_key is not None and state.starting >= per_key:
            return False
        bound = self._config.max_starting
        if bound is None:
            return True
        if background and bound > 1:
            bound -= 1
        return self._starting < bound

    def _serve_queue(self) -> None:
        """Give the queued keys their starts, one at a time, each to the key with the
        fewest workers (starting, busy and idle) the bounds let start now, until the
        bounds or the pool's room stop it; evicts idle workers of other keys when the
        pool is full."""
        bound = self._config.max_starting
        while self._queued and not self._closed:
            if bound is not None and self._starting >= bound:
                return
            best: tuple[int, KeyState[W]] | None = None
            for name in list(self._queued):
                state = self._keys.get(name)
                if state is None or state.unserved <= 0:
                    del self._queued[name]
                    continue
                if not self._may_start(state):
                    continue
                size = state.starting + len(state.busy) + len(state.idle)
                if best is None or size < best[0]:
                    best = (size, state)
            if best is None:
                return
            state = best[1]
            if self._room() <= 0 and not self._evict(exclude=state.name):
                return  # full: a release or a finished start wakes the queue again
            self._launch(state)
            if state.unserved <= 0:
                del self._queued[state.name]

    def _evict(self, *, exclude: str) -> bool:
        """Stop the least recently used idle worker of another key (keys above their
        target first). False if there is none."""
        now = self._clock()
        victim: tuple[tuple[bool, float], Entry[W], KeyState[W]] | None = None
        for name, state in self._keys.items():
            if name == exclude or not state.idle:
                continue
            needed = state.supply(now, one_shot=self._one_shot) <= self._target(state, now)
            for entry in state.idle:
                rank = (needed, entry.idle_since)
                if victim is None or rank < victim[0]:
                    victim = (rank, entry, state)
        if victim is None:
            return False
        _, entry, state = victim
        state.remove_idle(entry)
        self._retire(entry, f"evicted for {exclude}: the pool is full")
        return True

    def _unawaited_starts(self) -> int:
        """Starts in flight that no caller waits for (limited by ``start_concurrency``)."""
        return sum(
            max(0, self._keys[key].starting - len(self._keys[key].waiters))
            for key in self._starting_keys
        )

    def _launch(self, state: KeyState[W]) -> None:
        state.starting += 1
        self._starting += 1
        self._starting_keys.add(state.name)
        task = asyncio.create_task(self._start_one(state), name=f"{self.name}-start")
        self._start_tasks.add(task)
        task.add_done_callback(self._start_tasks.discard)

    async def _start_one(self, state: KeyState[W]) -> None:
        key = state.name
        began = self._clock()
        worker: W | None = None
        error: BaseException | None = None
        try:
            async with asyncio.timeout(self._config.start_timeout_s):
                worker = await self._factory.start(key)
        except TimeoutError:
            error = StartFailed(
                f"a {key} worker was not ready within {self._config.start_timeout_s:g}s"
            )
        except Exception as exc:
            error = exc
        finally:
            state.starting -= 1
            self._starting -= 1
            if not state.starting:
                self._starting_keys.discard(key)
            self._changed.set()
            if self._queued:
                self._wake.set()  # a queued key may take the start this one freed
        if self._closed:
            if worker is not None:
                self._spawn_stop(worker)
            return
        now = self._clock()
        if worker is None:
            assert error is not None
            self._start_failed(state, error, now)
            return
        elapsed = now - began
        state.sizing.started(elapsed)
        self._start_time.add(elapsed)
        state.failures = 0
        state.retry_at = 0.0
        entry = Entry(worker, key, started_at=now)
        self._entries[worker] = entry
        cold = self._deliver(entry, now)
        state.meter.started(cold=cold, cpu_ms=self._factory.start_cpu_ms(worker))
        logger.debug(
            "pool %s: %s ready in %.0f ms%s", key, worker.id, elapsed * 1000, " (cold)" * cold
        )
        self._poke(key)

    def _start_failed(self, state: KeyState[W], error: BaseException, now: float) -> None:
        state.failures += 1
        state.last_error = error
        delay = self._config.backoff(state.failures)
        state.retry_at = now + delay
        logger.warning(
            "pool %s: a start failed (%d in a row; refill retries in %.1fs): %s",
            state.name,
            state.failures,
            delay,
            error,
        )
        if state.unserved > 0:  # a waiter counted on this start: it gets the failure
            while state.waiters:
                waiter = state.waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(error)
                    break
        self._poke(state.name)

    # --- internals: the refill task -------------------------------------------------------
    def _poke(self, key: str) -> None:
        self._dirty.add(key)
        self._wake.set()

    def _wake_at(self, key: str, when: float) -> None:
        """Look at ``key`` again at clock time ``when``."""
        if self._closed:
            return
        previous = self._due.get(key)
        if previous is None or when < previous:
            self._due[key] = when
        if self._timer is None or when < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            delay = max(0.0, when - self._clock())
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)
            self._timer_at = when

    def _on_timer(self) -> None:
        self._timer = None
        now = self._clock()
        for key, when in list(self._due.items()):
            if when <= now:
                del self._due[key]
                self._poke(key)
        if self._due:
            key = min(self._due, key=self._due.__getitem__)
            self._wake_at(key, self._due[key])

    async def _refill_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                self._serve_queue()  # callers' starts first, then the background's
                self._refill()
            except Exception:  # a bug here must not stop the pool from refilling
                logger.exception("pool %s: refill failed", self.name)

    def _refill(self) -> None:
        now = self._clock()
        for key in list(self._dirty):
            state = self._keys.get(key)
            if state is None or self._closed:
                self._dirty.discard(key)
                continue
            if state.retry_at > now:
                self._wake_at(key, state.retry_at)
                continue
            target = self._target(state, now)
            while (
                state.supply(now, one_shot=self._one_shot) < target
                and self._unawaited_starts() < self._config.start_concurrency
                and self._room() > 0
                and self._may_start(state, background=True)
            ):
                self._launch(state)
            if state.supply(now, one_shot=self._one_shot) < target:
                continue  # stays dirty: a finished start or a freed slot pokes it again
            self._dirty.discard(key)
            if state.deferred:
                self._wake_at(key, min(entry.defer_until for entry in state.deferred))

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self._config.reap_interval_s)
            try:
                self.reap()
            except Exception:
                logger.exception("pool %s: reaping failed", self.name)


def _tag(context: str) -> str:
    """`` [inv=...]`` for log lines about a call, nothing otherwise."""
    return f" [{context}]" if context else ""
