"""The process table against a scripted process: output nobody takes is buffered up to
``BUFFER_BYTES``, then the process's output is paused (nothing is drained that nobody
reads); a follower that connects later gets the buffer first and its reading resumes
the output."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from node.sandboxes import processes
from node.sandboxes.base import Process
from node.sandboxes.processes import BUFFER_BYTES, ProcessTable
from wire.processes import StartProcess
from wire.sandboxes import ExecEvent, ExecExit, ExecOutput, ExecRequest, ExecStarted

CHUNK = 64 * 1024


class Flood(Process):
    """Writes numbered 64 KiB chunks while its output flows, like a command on a pipe:
    paused, it writes nothing more."""

    pid = 7

    def __init__(self) -> None:
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.pauses = 0
        self.written = 0
        self.ended = asyncio.Event()

    async def events(self) -> AsyncIterator[ExecEvent]:
        yield ExecStarted(pid=self.pid)
        while not self.ended.is_set():
            await self.flowing.wait()
            yield ExecOutput(stream="stdout", data=f"{self.written:08d}".ljust(CHUNK, "."))
            self.written += 1
            await asyncio.sleep(0)
        yield ExecExit(exit_code=0, duration_ms=1.0)

    def pause_output(self) -> None:
        self.pauses += 1
        self.flowing.clear()

    def resume_output(self) -> None:
        self.flowing.set()

    async def signal(self, signum: int) -> None:
        self.ended.set()
        self.flowing.set()

    async def write_stdin(self, data: bytes) -> None:
        return None

    async def close_stdin(self) -> None:
        return None


class Manager:
    def __init__(self, process: Process) -> None:
        self.process = process

    async def exec(self, sandbox_id: str, request: ExecRequest) -> Process:
        return self.process


async def settle() -> None:
    for _ in range(200):
        await asyncio.sleep(0)


async def test_unread_output_is_buffered_then_paused_and_a_later_follower_gets_it() -> None:
    flood = Flood()
    table = ProcessTable(Manager(flood))  # type: ignore[arg-type]
    start = StartProcess(request=ExecRequest(cmd=["yes"], timeout_s=None))
    starter = await table.start("sbx", start)
    assert isinstance(await anext(starter), ExecStarted)
    await settle()
    # the starter takes nothing more: its queue fills to the buffer, then output pauses
    assert flood.pauses == 1 and not flood.flowing.is_set()
    assert flood.written * CHUNK <= BUFFER_BYTES + CHUNK
    await starter.aclose()  # it leaves; what it had queued goes with it
    await settle()
    written = flood.written
    assert not flood.flowing.is_set()  # nobody takes it: still paused

    later = table.follow("sbx", flood.pid)
    assert isinstance(await anext(later), ExecStarted)
    seen = []
    for _ in range(3 * BUFFER_BYTES // CHUNK):  # reading lets the process write on
        event = await anext(later)
        assert isinstance(event, ExecOutput)
        seen.append(int(event.data[:8]))
    assert seen == sorted(seen) and seen[-1] > written  # in order, and past the pause
    await table.signal("sbx", flood.pid, 9)
    rest = [event async for event in later]
    assert isinstance(rest[-1], ExecExit)


async def test_output_that_comes_while_nobody_follows_waits_for_the_next_follower() -> None:
    flood = Flood()
    table = ProcessTable(Manager(flood))  # type: ignore[arg-type]
    starter = await table.start("sbx", StartProcess(request=ExecRequest(cmd=["yes"])))
    await starter.aclose()  # the starter leaves at once
    await settle()
    [running] = table._running["sbx"].values()
    assert BUFFER_BYTES <= running.backlog_bytes <= BUFFER_BYTES + CHUNK
    assert flood.pauses >= 1 and not flood.flowing.is_set()
    later = table.follow("sbx", flood.pid)
    assert isinstance(await anext(later), ExecStarted)
    first = await anext(later)
    assert isinstance(first, ExecOutput) and int(first.data[:8]) == 0  # from the start
    assert processes.BUFFER_BYTES == BUFFER_BYTES
    await table.signal("sbx", flood.pid, 9)
    await later.aclose()
    await table.close()
