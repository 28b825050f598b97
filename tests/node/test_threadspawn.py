"""A child started from a thread and driven from asyncio: its pipes and exit on the loop,
its ``prepare`` on another thread, and nothing left running when its caller gives up
half-way."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading

import pytest

from node import threadspawn


async def test_a_child_talks_through_its_pipes_and_reports_its_exit() -> None:
    seen: list[int] = []

    def prepare() -> subprocess.Popen[bytes]:
        seen.append(threading.get_ident())
        return subprocess.Popen(
            ["sh", "-c", "cat; echo err >&2; exit 7"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    child = await threadspawn.launch(prepare)
    assert seen and seen[0] != threading.get_ident()  # not on the loop's thread
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None
    child.stdin.write(b"hello")
    await child.stdin.drain()
    child.stdin.close()
    assert await child.stdout.read() == b"hello"
    assert await child.stderr.read() == b"err\n"
    assert await child.wait() == 7 and child.returncode == 7


async def test_a_caller_cancelled_during_prepare_leaves_no_child() -> None:
    started: list[subprocess.Popen[bytes]] = []
    release = threading.Event()

    def prepare() -> subprocess.Popen[bytes]:
        release.wait(10)
        popen = subprocess.Popen(["sleep", "60"])
        started.append(popen)
        return popen

    task = asyncio.create_task(threadspawn.launch(prepare))
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done()  # the cancellation waits for prepare ...
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    [popen] = started  # ... and then kills and reaps what it started
    assert popen.returncode == -9  # set by its wait: killed and reaped


async def test_a_failed_prepare_is_the_callers_error() -> None:
    def prepare() -> subprocess.Popen[bytes]:
        raise RuntimeError("no cgroup")

    with pytest.raises(RuntimeError, match="no cgroup"):
        await threadspawn.launch(prepare)


async def test_signals_reach_a_running_child_and_never_a_reaped_pid() -> None:
    child = await threadspawn.launch(lambda: subprocess.Popen(["sleep", "60"]))
    child.terminate()
    assert await child.wait() == -15
    child.kill()  # reaped already: nothing is signalled


async def test_a_command_started_off_the_loop_takes_input_and_answers_both_streams() -> None:
    child = await threadspawn.start(
        "sh",
        "-c",
        "cat; echo err >&2; exit 3",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert await child.communicate(b"x" * 200_000) == (b"x" * 200_000, b"err\n")
    assert child.returncode == 3


def test_a_childs_input_is_closed_once_under_uvloop_while_other_threads_open_files() -> None:
    """uvloop's write-pipe transport closed its descriptor twice; a number another
    thread had reused in between (a sandbox's mounts, a jail's start) was closed under
    it, which surfaced as EBADF in that thread's own ``os.close``."""
    uvloop = pytest.importorskip("uvloop")
    errors: list[OSError] = []
    stop = threading.Event()

    def open_and_close() -> None:
        while not stop.is_set():
            fds = [os.open("/proc/self/stat", os.O_RDONLY) for _ in range(5)]
            for fd in fds:
                try:
                    os.close(fd)
                except OSError as exc:
                    errors.append(exc)

    async def one() -> None:
        child = await threadspawn.start("cat", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert await child.communicate(b"x") == (b"x", b"")

    async def rounds() -> None:
        for _ in range(100):
            await asyncio.gather(*(one() for _ in range(8)))

    other = threading.Thread(target=open_and_close)
    other.start()
    try:
        uvloop.run(rounds())
    finally:
        stop.set()
        other.join()
    assert errors == []
