"""A host command whose caller is cancelled still ends and is reaped (real processes)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from node.children import communicate


async def _start(*argv: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


def _exists(path: Path) -> bool:
    return path.exists()


def _reaped(pid: int) -> bool:
    """No process, not even a zombie, has ``pid``."""
    return not os.path.exists(f"/proc/{pid}")


async def test_the_output_of_a_command_that_ends() -> None:
    proc = await _start("sh", "-c", "cat; echo err >&2")
    out, err = await communicate(proc, b"in\n")
    assert (out, err, proc.returncode) == (b"in\n", b"err\n", 0)


async def test_a_cancelled_caller_lets_the_command_finish_and_reaps_it(tmp_path: Path) -> None:
    done = tmp_path / "done"
    proc = await _start("sh", "-c", f"sleep 0.3; touch {done}")
    caller = asyncio.create_task(communicate(proc))
    await asyncio.sleep(0.05)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    # the command ran to its end (no half-made change) and was reaped before the
    # cancellation reached the caller: nothing is left for a closed loop to collect
    assert _exists(done) and proc.returncode == 0
    assert _reaped(proc.pid)


async def test_a_command_past_its_grace_is_killed_and_reaped() -> None:
    proc = await _start("sleep", "30")
    caller = asyncio.create_task(communicate(proc, grace_s=0.1))
    await asyncio.sleep(0.05)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert proc.returncode == -9  # killed: it would have slept 30 s
    assert _reaped(proc.pid)
