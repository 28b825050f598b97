"""A child started from a thread and driven from asyncio: its pipes and exit on the loop,
its ``prepare`` on another thread, and nothing left running when its caller gives up
half-way."""

from __future__ import annotations

import asyncio
import subprocess
import threading

import pytest

from runtimes import threadspawn


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
