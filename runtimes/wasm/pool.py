"""Warm instances of one interpreter, each handed out for one call and never returned.

A refill thread keeps ``target`` instances ready (started, bootstrap waiting on stdin),
warming at most ``start_concurrency`` at once; the guest threads do the actual work with
the GIL released. ``acquire()`` takes a ready instance, else claims one that is warming,
else starts one for the caller (a cold start, ~65 ms for CPython). An instance that dies
before it is ready counts as a failure and the refill backs off, so a broken interpreter
cannot make the pool spin.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable

from runtimes.wasm.instance import Instance

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0


class WarmupError(RuntimeError):
    """An instance ended or timed out before it was ready."""


class WarmPool:
    def __init__(
        self,
        name: str,
        factory: Callable[[], Instance],
        *,
        target: int,
        start_concurrency: int,
        warmup_timeout_s: float,
        refill_delay_s: float = 0.0,
    ) -> None:
        self.name = name
        self._refill_delay_s = refill_delay_s
        self._factory = factory
        self._target = target
        self._start_concurrency = start_concurrency
        self._warmup_timeout_s = warmup_timeout_s
        self._cond = threading.Condition()
        self._idle: collections.deque[Instance] = collections.deque()
        self._starting: set[Instance] = set()
        self._claimed: set[Instance] = set()
        #: handed-out instances whose replacement is deferred: id -> monotonic hand-out time
        self._deferred: dict[int, float] = {}
        self._closed = False
        self._failures = 0
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None and self._target > 0:
            self._thread = threading.Thread(
                target=self._refill, name=f"wasm-pool-{self.name}", daemon=True
            )
            self._thread.start()

    async def wait_warm(self, timeout: float) -> bool:
        """Wait until ``target`` instances are ready (used by start-up and tests)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            with self._cond:
                if len(self._idle) >= self._target or self._closed:
                    return True
            await asyncio.sleep(0.01)
        return False

    def close(self) -> list[Instance]:
        """Stop refilling and abort every instance not handed out; returns them so the
        caller can join their threads. Idempotent."""
        with self._cond:
            self._closed = True
            doomed = list(self._idle) + list(self._starting)
            self._idle.clear()
            self._starting.clear()
            self._claimed.clear()
            self._cond.notify_all()
        self._wake.set()
        for inst in doomed:
            inst.abort()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return doomed

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {"warm": len(self._idle), "starting": len(self._starting)}

    # --- handing out --------------------------------------------------------------------
    async def acquire(self) -> Instance:
        """A ready instance for one call; raises ``WarmupError`` if none can be made."""
        claimed: Instance | None = None
        with self._cond:
            if self._closed:
                raise WarmupError(f"pool {self.name} is closed")
            while self._idle:
                idle = self._idle.popleft()
                if not idle.done.is_set():
                    if self._refill_delay_s > 0:
                        self._deferred[id(idle)] = time.monotonic()
                    self._cond.notify_all()  # below target: the refill starts another
                    return idle
                idle.dispose()
            unclaimed = [i for i in self._starting if i not in self._claimed]
            if unclaimed:
                claimed = unclaimed[0]
                self._claimed.add(claimed)
                self._cond.notify_all()
        if claimed is None:
            claimed = self._spawn(claimed=True)
        return await self._await_ready(claimed)

    def returned(self, inst: Instance) -> None:
        """The call on ``inst`` is over: its replacement need not wait any longer."""
        with self._cond:
            if self._deferred.pop(id(inst), None) is not None:
                self._cond.notify_all()

    async def _await_ready(self, inst: Instance) -> Instance:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[bool] = loop.create_future()

        def resolve(value: bool) -> None:
            if not ready.done():
                ready.set_result(value)

        def settle(value: bool) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone
                loop.call_soon_threadsafe(resolve, value)

        inst.on_ready(lambda _i: settle(True))
        inst.on_done(lambda _i: settle(False))
        try:
            ok = await asyncio.wait_for(ready, self._warmup_timeout_s)
        except TimeoutError:
            ok = False
        except asyncio.CancelledError:
            self._forget(inst)
            inst.abort()
            inst.dispose()
            raise
        self._forget(inst)
        if not ok or inst.done.is_set():
            inst.abort()
            inst.dispose()
            raise WarmupError(f"a {self.name} instance failed to start: {_tail(inst)}")
        return inst

    def _forget(self, inst: Instance) -> None:
        with self._cond:
            self._starting.discard(inst)
            self._claimed.discard(inst)
            self._cond.notify_all()

    # --- refilling ----------------------------------------------------------------------
    def _spawn(self, *, claimed: bool) -> Instance:
        inst = self._factory()
        with self._cond:
            self._starting.add(inst)
            if claimed:
                self._claimed.add(inst)
        inst.on_ready(self._became_ready)
        inst.on_done(self._ended)
        inst.start()
        return inst

    def _became_ready(self, inst: Instance) -> None:
        with self._cond:
            if inst not in self._starting:
                return
            self._failures = 0
            if inst in self._claimed:
                return  # its claimer takes it
            self._starting.discard(inst)
            if self._closed:
                inst.abort()
            else:
                self._idle.append(inst)
            self._cond.notify_all()

    def _ended(self, inst: Instance) -> None:
        with self._cond:
            before_ready = inst in self._starting and not inst.ready.is_set()
            self._starting.discard(inst)
            self._claimed.discard(inst)
            if inst in self._idle:
                self._idle.remove(inst)
            if before_ready and not self._closed:
                self._failures += 1
                log.warning(
                    "wasm pool %s: instance %s died while starting (%d in a row): %s",
                    self.name,
                    inst.id,
                    self._failures,
                    _tail(inst),
                )
            self._cond.notify_all()
        if before_ready or not inst.armed_limits:
            inst.dispose()

    def _needed(self) -> tuple[bool, float | None]:
        """Whether to start an instance now, else how long a deferral has left (if any).

        The replacement of a handed-out instance waits until its call is over or
        ``refill_delay_s`` has passed: warming an interpreter takes ~50 ms of CPU, and on a
        small node it would slow down the short call it replaces.
        """
        if len(self._starting) >= self._start_concurrency + len(self._claimed):
            return False, None
        now = time.monotonic()
        self._deferred = {
            key: t for key, t in self._deferred.items() if t + self._refill_delay_s > now
        }
        waiting = [t + self._refill_delay_s - now for t in self._deferred.values()]
        unclaimed = len(self._starting) - len(self._claimed)
        if len(self._idle) + unclaimed + len(waiting) < self._target:
            return True, None
        if len(self._idle) + unclaimed < self._target and waiting:
            return False, min(waiting)
        return False, None

    def _refill(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    needed, retry_in = self._needed()
                    if needed:
                        break
                    self._cond.wait(retry_in)
                if self._closed:
                    return
                failures = self._failures
            if failures and self._wake.wait(min(MAX_BACKOFF_S, 0.1 * 2**failures)):
                return
            try:
                self._spawn(claimed=False)
            except Exception:
                log.exception("wasm pool %s: cannot create an instance", self.name)
                with self._cond:
                    self._failures += 1


def _tail(inst: Instance) -> str:
    if not inst.outcome.done():
        return "not ready in time"
    outcome = inst.outcome.result()
    return outcome.error or outcome.trap or f"exit code {outcome.exit_code}"
