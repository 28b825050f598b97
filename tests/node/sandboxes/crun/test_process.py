"""``CrunProcess`` against a scripted child: its output passes as the bytes read (a
character cut by a read is not lost); the wait after SIGKILL is bounded (a wedged sandbox
init may never report the command's end), and the exec is then reported killed."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from node.sandboxes.crun import process as crun_process
from node.sandboxes.crun.process import READ_CHUNK, CrunProcess
from wire.sandboxes import collect


class NeverEnds:
    """A child whose end is never reported (its init wedged), even after SIGKILL."""

    stdin: asyncio.StreamWriter | None = None

    def __init__(self) -> None:
        self.stdout = asyncio.StreamReader()
        self.stderr = asyncio.StreamReader()
        self.killed = False
        self._never: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def wait(self) -> int:
        return await asyncio.shield(self._never)

    def kill(self) -> None:
        self.killed = True


async def test_a_command_whose_end_never_comes_is_reported_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(crun_process, "KILL_WAIT_S", 0.2, raising=False)
    child = NeverEnds()
    process = CrunProcess(
        child,
        host_pid=2**22 + 1,  # no such process: nothing to signal
        procs_file=tmp_path / "cgroup.procs",
        timeout_s=0.1,
        max_output_bytes=1024,
    )
    result = await asyncio.wait_for(collect(process.events()), timeout=10)  # a hang guard
    assert result.timed_out and result.signal == signal.SIGKILL and result.exit_code is None


class Writes:
    """A child that wrote ``data`` to stdout and exited."""

    stdin: asyncio.StreamWriter | None = None

    def __init__(self, data: bytes) -> None:
        self.stdout = asyncio.StreamReader()
        self.stdout.feed_data(data)
        self.stdout.feed_eof()
        self.stderr = asyncio.StreamReader()
        self.stderr.feed_eof()

    async def wait(self) -> int:
        return 0

    def kill(self) -> None:
        return None


async def test_output_passes_as_the_bytes_read(tmp_path: Path) -> None:
    """The first read ends inside the euro sign's three bytes; the rest is not text."""
    data = b"a" * (READ_CHUNK - 1) + "€".encode() + bytes(range(256)) * 300
    process = CrunProcess(
        Writes(data),
        host_pid=2**22 + 1,
        procs_file=tmp_path / "cgroup.procs",
        timeout_s=10,
        max_output_bytes=1 << 20,
    )
    result = await asyncio.wait_for(collect(process.events()), timeout=10)  # a hang guard
    assert result.exit_code == 0 and result.stdout == data
