"""One command in a microVM sandbox, started by the guest agent (``channel.GuestProcess``).

The agent runs the command in a session of its own inside the guest, so a signal reaches
its whole tree. Output comes over the data port as the guest read it, under the stream's
credit window: the channel grants more only as this process takes output, and this
process takes it only while its consumer does (at most ``QUEUED_OUTPUTS`` chunks queued;
``pause_output`` stops taking), so a command nobody reads blocks on write in the guest,
as on a full pipe, and nothing piles up on the host. Each stream keeps the request's cap
and counts what it dropped (output past the cap is still taken, so the command is never
stuck, and dropped). On timeout the whole session gets SIGKILL; an exit the guest never
reports after that is reported as killed after ``KILL_WAIT_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable

from node.sandboxes.base import NotATerminal, Process
from node.sandboxes.microvm.channel import AgentError, AgentGone, GuestProcess
from node.sandboxes.outputcap import OutputCap
from wire.sandboxes import ExecEvent, ExecOutput, ExecStarted, PtySize

log = logging.getLogger(__name__)

#: output chunks queued for the consumer at most; the guest's stream waits beyond
QUEUED_OUTPUTS = 4
#: how long the guest may take to report the command's end after SIGKILL
KILL_WAIT_S = 5.0


class VmProcess(Process):
    def __init__(
        self,
        guest: GuestProcess,
        *,
        sandbox_id: str,
        terminal: bool,
        timeout_s: float | None,
        max_output_bytes: int,
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        self._guest = guest
        self.pid = guest.pid
        self._sandbox_id = sandbox_id
        self._terminal = terminal
        self._timeout_s = timeout_s
        self._output = OutputCap(max_output_bytes)
        self._on_exit = on_exit
        self._queue: asyncio.Queue[ExecEvent | None] = asyncio.Queue()
        self._room = asyncio.Semaphore(QUEUED_OUTPUTS)
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._signalled: int | None = None
        self._timed_out = False
        self._started = time.monotonic()
        self._status: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(), name=f"vm-exec-{sandbox_id}-{self.pid}")

    async def _pump(self) -> None:
        """Take the guest's events: output into the queue (capped), then the status."""
        status: int | None = None
        try:
            async for kind, value in self._guest.events():
                if kind == "exit":
                    assert isinstance(value, int)
                    status = value
                    break
                assert isinstance(value, bytes)
                name = "pty" if self._terminal else kind
                await self._flowing.wait()
                kept = self._output.take(name, value)
                if kept:
                    await self._room.acquire()
                    self._queue.put_nowait(ExecOutput(stream=name, data=kept))
        except AgentGone as gone:
            log.warning(
                "sandbox=%s exec %s: the guest agent is gone: %s", self._sandbox_id, self.pid, gone
            )
        if not self._status.done():
            self._status.set_result(status)

    async def _run(self) -> None:
        self._queue.put_nowait(ExecStarted(pid=self.pid))
        pump = asyncio.create_task(self._pump())
        error: str | None = None
        try:
            try:
                status = await asyncio.wait_for(asyncio.shield(self._status), self._timeout_s)
            except TimeoutError:
                self._timed_out = True
                await self._send_signal(signal.SIGKILL)
                try:
                    status = await asyncio.wait_for(asyncio.shield(self._status), KILL_WAIT_S)
                except TimeoutError:
                    log.warning(
                        "sandbox=%s exec %s: no exit %.0f s after SIGKILL; reported as killed",
                        self._sandbox_id,
                        self.pid,
                        KILL_WAIT_S,
                    )
                    status = int(signal.SIGKILL)  # a wait status: killed by SIGKILL
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump
            with contextlib.suppress(Exception):
                await self._guest.release()
            if self._on_exit is not None:
                self._on_exit()
        exit_code: int | None
        sig: int | None = None
        if status is None:
            exit_code, error = None, "the sandbox ended before the command did"
        elif status & 0x7F == 0:  # exited
            exit_code = (status >> 8) & 0xFF
        else:
            exit_code, sig = None, status & 0x7F
        self._queue.put_nowait(
            self._output.exit(
                exit_code=exit_code,
                signal=sig,
                timed_out=self._timed_out,
                started=self._started,
                error=error,
            )
        )
        self._queue.put_nowait(None)

    async def events(self) -> AsyncIterator[ExecEvent]:
        while (event := await self._queue.get()) is not None:
            if isinstance(event, ExecOutput):
                self._room.release()
            yield event

    def pause_output(self) -> None:
        self._flowing.clear()

    def resume_output(self) -> None:
        self._flowing.set()

    async def _send_signal(self, signum: int) -> None:
        with contextlib.suppress(AgentGone, AgentError):
            await self._guest.signal(signum)

    async def signal(self, signum: int) -> None:
        self._signalled = signum
        await self._send_signal(signum)

    async def write_stdin(self, data: bytes) -> None:
        try:
            await self._guest.write_stdin(data)
        except (AgentGone, AgentError) as closed:
            raise BrokenPipeError(f"the command's stdin is closed: {closed}") from None

    async def close_stdin(self) -> None:
        if not self._terminal:  # a terminal's input is open as long as it is
            with contextlib.suppress(AgentGone, AgentError):
                await self._guest.close_stdin()

    async def resize(self, size: PtySize) -> None:
        if not self._terminal:
            raise NotATerminal(f"process {self.pid} has no terminal")
        try:
            await self._guest.resize(size.cols, size.rows)
        except AgentError as refused:
            raise NotATerminal(str(refused)) from None

    async def kill(self) -> None:
        await self._send_signal(signal.SIGKILL)
