"""One command in a container sandbox: started by the sandbox's init (``spawn``), or, in a
sandbox made without a spawner, by ``crun exec`` of ``corral-init exec CMD``.

Either way the command gets a session of its own, so its whole tree (children
and grandchildren that did not start sessions of their own) is found by session id in
the sandbox's cgroup and signalled together: on timeout, on ``signal``, and on kill.
Output is read from the pipes as it comes and passed on as the bytes read (never decoded
here: a character split between two reads, or output that is not text, must reach the
caller whole; ``wire.sandboxes.ExecOutput``); each stream keeps the request's cap and
counts what it dropped. Past its cap a stream is drained by the kernel (``discard``:
spliced to /dev/null), not read. Output waits for its consumer: at most
``QUEUED_OUTPUTS`` chunks are queued, and ``pause_output`` (the process table, when
nobody reads a background command) stops reading the pipes, so the command blocks on
write as it would on a full pipe. When the command has exited, output its background
children still write is read for a short grace period, then the pipes are closed (a
daemon holding stdout must not hold the answer).

A command on a terminal (``ExecRequest.pty``: only through the sandbox's init) has one
output stream, ``pty``, read from the terminal's master with the same cap and flow
control; past its cap it is read and dropped at most ``READ_CHUNK`` per
``TERMINAL_DROP_S`` (the kernel cannot splice a terminal), so a flood costs the node
little and the command is never stuck. Its input stays open; ``resize`` sets its size.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Protocol

from node.pipes import PipeWriter
from node.sandboxes.base import NotATerminal, Process
from node.sandboxes.crun import spawn
from node.sandboxes.crun.discard import discard
from node.sandboxes.outputcap import OutputCap, Stream
from wire.sandboxes import ExecEvent, ExecOutput, ExecStarted, PtySize

log = logging.getLogger(__name__)

#: how long output of background children is still read once the command has exited
DRAIN_GRACE_S = 0.05
READ_CHUNK = 64 * 1024
#: output chunks queued for the consumer at most; the pipes' readers wait beyond
QUEUED_OUTPUTS = 4
#: how long the command's session may take to end after SIGKILL (a wedged init may never
#: report it); then it is reported killed anyway
KILL_WAIT_S = 5.0
#: a terminal's output past its cap: at most one chunk read (and dropped) per interval
TERMINAL_DROP_S = 0.01


def _pipe_transport(stream: asyncio.StreamReader) -> asyncio.ReadTransport | None:
    """The transport that feeds ``stream`` from its pipe (a ``node.pipes.PipeReader``,
    or an asyncio subprocess's pipe transport), or None."""
    transport = getattr(stream, "_transport", None)
    return transport if isinstance(transport, asyncio.ReadTransport) else None


def session_members(procs_file: Path, session: int) -> list[int]:
    """Host pids of the processes in ``procs_file``'s cgroup whose session is ``session``."""
    try:
        pids = [int(p) for p in procs_file.read_text().split()]
    except OSError:
        return []
    members = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[3]) == session:  # after the comm: state ppid pgrp session
                members.append(pid)
        except (OSError, IndexError, ValueError):
            continue
    return members


def inner_pid(host_pid: int) -> int | None:
    """The pid the sandbox sees for ``host_pid`` (the last NSpid)."""
    try:
        with open(f"/proc/{host_pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


class Child(Protocol):
    """What a command's runner gives: a ``crun exec`` (an asyncio subprocess) or a
    command the sandbox's init started (``spawn.Spawned``)."""

    @property
    def stdin(self) -> asyncio.StreamWriter | PipeWriter | None: ...

    stdout: asyncio.StreamReader | None
    stderr: asyncio.StreamReader | None

    async def wait(self) -> int: ...

    def kill(self) -> None: ...


class CrunProcess(Process):
    def __init__(
        self,
        proc: Child,
        *,
        host_pid: int,
        procs_file: Path,
        timeout_s: float | None,
        max_output_bytes: int,
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        self._proc = proc
        self.host_pid = host_pid
        self.pid = inner_pid(host_pid) or 0
        self._procs_file = procs_file
        self._timeout_s = timeout_s
        self._output = OutputCap(max_output_bytes)
        self._on_exit = on_exit
        self._queue: asyncio.Queue[ExecEvent | None] = asyncio.Queue()
        self._room = asyncio.Semaphore(QUEUED_OUTPUTS)  #: output chunks the queue may take
        self._flowing = asyncio.Event()  #: cleared by ``pause_output``
        self._flowing.set()
        self._discarding: set[str] = set()  #: streams past their cap, drained by the kernel
        self._terminal = bool(getattr(proc, "terminal", False))
        self._signalled: int | None = None
        self._timed_out = False
        self._started = time.monotonic()
        self._task = asyncio.create_task(self._run(), name=f"exec-{host_pid}")

    def _streams(self) -> list[tuple[Stream, asyncio.StreamReader | None]]:
        if self._terminal:
            return [("pty", self._proc.stdout)]
        return [("stdout", self._proc.stdout), ("stderr", self._proc.stderr)]

    async def _read(self, stream: asyncio.StreamReader | None, name: Stream) -> None:
        if stream is None:
            return
        while True:
            await self._flowing.wait()
            chunk = await stream.read(READ_CHUNK)
            if not chunk:
                return
            kept = self._output.take(name, chunk)
            if kept:
                await self._room.acquire()
                self._queue.put_nowait(ExecOutput(stream=name, data=kept))
            elif name == "pty":
                await asyncio.sleep(TERMINAL_DROP_S)  # past the cap: read slowly, dropped
            elif (transport := _pipe_transport(stream)) is not None:
                # past the cap (a whole chunk dropped): the kernel drains the rest
                self._discarding.add(name)
                self._output.drop(name, await discard(transport))
                return

    async def _run(self) -> None:
        self._queue.put_nowait(ExecStarted(pid=self.pid))
        readers = asyncio.gather(*(self._read(stream, name) for name, stream in self._streams()))
        try:
            try:
                code = await asyncio.wait_for(self._proc.wait(), self._timeout_s)
            except TimeoutError:
                self._timed_out = True
                await self._kill_session(signal.SIGKILL)
                code = await self._reaped()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(readers), DRAIN_GRACE_S)
        finally:
            readers.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await readers
            for pipe in (self._proc.stdout, self._proc.stderr):
                if pipe is not None:
                    pipe.feed_eof()
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            close = getattr(self._proc, "close", None)
            if close is not None:
                close()  # a spawned command's pipes are the node's own to close
            if self._on_exit is not None:
                self._on_exit()
        sig = None
        exit_code: int | None = code
        if code is not None and code > 128 and (self._timed_out or self._signalled):
            sig, exit_code = code - 128, None
        elif code is not None and code < 0:
            sig, exit_code = -code, None
        self._queue.put_nowait(
            self._output.exit(
                exit_code=exit_code, signal=sig, timed_out=self._timed_out, started=self._started
            )
        )
        self._queue.put_nowait(None)

    async def _reaped(self) -> int:
        """The command's exit status after SIGKILL; if it does not come within
        ``KILL_WAIT_S`` (the sandbox's init does not report it), killed all the same."""
        try:
            return await asyncio.wait_for(self._proc.wait(), KILL_WAIT_S)
        except TimeoutError:
            log.warning(
                "exec %s: no exit reported %.0f s after SIGKILL; reported as killed",
                self.host_pid,
                KILL_WAIT_S,
            )
            return -int(signal.SIGKILL)

    async def events(self) -> AsyncIterator[ExecEvent]:
        while (event := await self._queue.get()) is not None:
            if isinstance(event, ExecOutput):
                self._room.release()
            yield event

    def pause_output(self) -> None:
        """Stop reading the command's pipes (they fill, and the command blocks on write)
        until ``resume_output``; output past the cap is still discarded."""
        self._flowing.clear()
        for transport in self._transports():
            transport.pause_reading()

    def resume_output(self) -> None:
        self._flowing.set()
        for transport in self._transports():
            transport.resume_reading()

    def _transports(self) -> list[asyncio.ReadTransport]:
        found = []
        for name, stream in self._streams():
            if stream is None or name in self._discarding or stream.at_eof():
                continue
            transport = _pipe_transport(stream)
            if transport is not None and not transport.is_closing():
                found.append(transport)
        return found

    async def _kill_session(self, signum: int) -> None:
        """Signal every process of the command's session, again until none is left when
        the signal kills (a forking tree keeps making new ones for a while)."""
        for _ in range(50 if signum == signal.SIGKILL else 1):
            members = session_members(self._procs_file, self.host_pid)
            if not members:
                return
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signum)
            await asyncio.sleep(0.005)
        log.warning("exec %s: processes of its session survived SIGKILL", self.host_pid)

    async def signal(self, signum: int) -> None:
        self._signalled = signum
        await self._kill_session(signum)

    async def write_stdin(self, data: bytes) -> None:
        stdin = self._proc.stdin
        if stdin is None or stdin.is_closing():
            raise BrokenPipeError("the command's stdin is closed")
        stdin.write(data)
        await stdin.drain()

    async def close_stdin(self) -> None:
        if self._proc.stdin is not None and not self._terminal:
            self._proc.stdin.close()  # a terminal's input is open as long as it is

    async def resize(self, size: PtySize) -> None:
        stdin = self._proc.stdin
        if not self._terminal or stdin is None or stdin.is_closing():
            raise NotATerminal(f"process {self.pid} has no terminal")
        assert isinstance(stdin, PipeWriter)
        spawn.resize(stdin.fileno(), size)

    async def kill(self) -> None:
        await self._kill_session(signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self._proc.kill()
