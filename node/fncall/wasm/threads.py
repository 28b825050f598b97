"""``GuestThreads``: the long-lived threads that guests run on, one guest at a time.

Every instance runs its guest on a thread of its own, because wasm runs with the GIL
released and a guest may block in a host call for as long as its limits allow. Starting a
Python thread per call was the largest item of the worker's event loop: ``Thread.start``
waits until the new thread has taken the GIL, and with guests and the epoch ticker
competing for it that wait was 38 % of the loop's time at concurrency 32
(docs/benchmarks-history.md, "Guest threads kept, stdin in memory, one shared empty work
dir").
These threads are kept instead: a task goes to an idle thread when there is one and starts
a new thread only when there is none, so no task waits for another to finish, and the
number of threads follows the number of guests running at once. A thread idle for
``idle_timeout_s`` exits.

Only the operating-system thread is reused. Each task is one instance's whole life (its
own Store, memory, WASI context and host dir, made and closed per call), and it leaves the
thread nothing: the instance unbinds its host-call clock in a ``finally``.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

Task = Callable[[], None]


class GuestThreads:
    def __init__(self, *, name: str = "wasm-guest", idle_timeout_s: float = 30.0) -> None:
        self._name = name
        self._idle_timeout_s = idle_timeout_s
        self._tasks: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  #: threads waiting for a task, minus tasks handed to them not yet taken
        self._threads: set[threading.Thread] = set()
        self._numbers = itertools.count(1)
        self._closed = False

    def run(self, task: Task) -> None:
        """Run ``task`` on an idle thread, or on a new one if none is idle."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the guest threads are closed")
            if self._idle > 0:
                self._idle -= 1
                self._tasks.put(task)
                return
            thread = threading.Thread(
                target=self._serve,
                args=(task,),
                name=f"{self._name}-{next(self._numbers)}",
                daemon=True,
            )
            self._threads.add(thread)
        thread.start()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"threads": len(self._threads), "idle": self._idle}

    def close(self, timeout: float) -> list[str]:
        """Stop the idle threads and wait for the busy ones, at most ``timeout``; the
        names of those still running (a guest that ignored its deadline). Idempotent."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, 0
            threads = list(self._threads)
        for _ in range(idle):
            self._tasks.put(None)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in threads if t.is_alive()]

    def _serve(self, task: Task | None) -> None:
        try:
            while task is not None:
                try:
                    task()
                except Exception:
                    log.exception("%s: a guest task failed", threading.current_thread().name)
                task = self._next()
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _next(self) -> Task | None:
        """The next task for this thread, or None when it should exit."""
        with self._lock:
            if self._closed:
                return None
            self._idle += 1
        try:
            return self._tasks.get(timeout=self._idle_timeout_s)
        except queue.Empty:
            pass
        with self._lock:
            # ``run`` hands a task over under this lock: if one is queued, it was counted
            # against the idle threads, this one included, so this thread takes it
            try:
                return self._tasks.get_nowait()
            except queue.Empty:
                self._idle -= 1
                return None
