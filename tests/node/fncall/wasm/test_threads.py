"""``GuestThreads``: tasks on kept threads, a new thread only when none is idle."""

from __future__ import annotations

import threading
import time

import pytest

from node.fncall.wasm.threads import GuestThreads

WAIT_S = 5.0


def _record(into: list[int], done: threading.Event | None = None) -> None:
    into.append(threading.get_ident())
    if done is not None:
        done.set()


def _wait_idle(threads: GuestThreads, idle: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while threads.stats()["idle"] != idle:
        assert time.monotonic() < deadline, threads.stats()
        time.sleep(0.005)


def test_a_task_after_another_runs_on_the_kept_thread() -> None:
    threads = GuestThreads(name="t-reuse")
    seen: list[int] = []
    try:
        for _ in range(5):
            done = threading.Event()
            threads.run(lambda done=done: _record(seen, done))
            assert done.wait(WAIT_S)
            _wait_idle(threads, 1)
        assert len(set(seen)) == 1
        assert threads.stats() == {"threads": 1, "idle": 1}
    finally:
        assert threads.close(WAIT_S) == []


def test_no_task_waits_for_a_busy_one() -> None:
    """Tasks that block until all have started each get a thread of their own."""
    threads = GuestThreads(name="t-parallel")
    count = 4
    barrier = threading.Barrier(count, timeout=WAIT_S)
    seen: list[int] = []

    def task() -> None:
        barrier.wait()
        _record(seen)

    try:
        for _ in range(count):
            threads.run(task)
        deadline = time.monotonic() + WAIT_S
        while len(seen) < count:
            assert time.monotonic() < deadline, "a task waited for another to finish"
            time.sleep(0.005)
        assert len(set(seen)) == count
        _wait_idle(threads, count)
        # the kept threads serve the next round: no new one is started
        for _ in range(count):
            threads.run(task)
        _wait_idle(threads, count)
        assert threads.stats()["threads"] == count
    finally:
        assert threads.close(WAIT_S) == []


def test_an_idle_thread_exits_after_its_timeout() -> None:
    threads = GuestThreads(name="t-idle", idle_timeout_s=0.05)
    done = threading.Event()
    threads.run(done.set)
    assert done.wait(WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while threads.stats()["threads"]:
        assert time.monotonic() < deadline, threads.stats()
        time.sleep(0.01)
    assert threads.stats() == {"threads": 0, "idle": 0}
    assert not [t for t in threading.enumerate() if t.name.startswith("t-idle")]
    again = threading.Event()
    threads.run(again.set)  # a new thread takes the next task
    assert again.wait(WAIT_S)
    assert threads.close(WAIT_S) == []


def test_a_failing_task_leaves_its_thread_serving() -> None:
    threads = GuestThreads(name="t-fail")
    seen: list[int] = []

    def fail() -> None:
        _record(seen)
        raise ValueError("the guest task failed")

    try:
        threads.run(fail)
        _wait_idle(threads, 1)
        done = threading.Event()
        threads.run(lambda: _record(seen, done))
        assert done.wait(WAIT_S)
        assert len(seen) == 2 and len(set(seen)) == 1
    finally:
        assert threads.close(WAIT_S) == []


def test_close_joins_idle_threads_and_names_a_busy_one() -> None:
    threads = GuestThreads(name="t-close")
    release = threading.Event()
    threads.run(release.wait)
    done = threading.Event()
    threads.run(done.set)
    assert done.wait(WAIT_S)
    _wait_idle(threads, 1)
    busy = threads.close(0.1)
    assert busy == ["t-close-1"]
    assert [t.name for t in threading.enumerate() if t.name.startswith("t-close")] == busy
    with pytest.raises(RuntimeError, match="closed"):
        threads.run(done.set)
    release.set()
    assert threads.close(WAIT_S) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("t-close")]
