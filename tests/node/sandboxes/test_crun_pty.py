"""Commands on a terminal in a container sandbox: the terminal is the sandbox's own (its
devpts), the command's controlling terminal and stdio, as the user; the node holds only
its master, through which input goes in, output comes out as one ``pty`` stream (capped
like stdout) and the size is set (SIGWINCH reaches the command)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator

import pytest

from node.sandboxes.base import NotATerminal, Process, RootImage
from node.sandboxes.crun.backend import CrunBackend
from tests.node.sandboxes.conftest import spec
from wire.sandboxes import ExecExit, ExecOutput, ExecRequest, PtySize

pytestmark = pytest.mark.crun


class Screen:
    """What a terminal's command wrote, gathered as it comes; its exit once seen."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self.text = ""
        self.streams: set[str] = set()
        self.exit: ExecExit | None = None
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._gather(process.events()))

    async def _gather(self, events: AsyncIterator[object]) -> None:
        async for event in events:
            if isinstance(event, ExecOutput):
                self.streams.add(event.stream)
                self.text += event.data.decode(errors="replace")
            elif isinstance(event, ExecExit):
                self.exit = event
            self._changed.set()

    async def shows(self, text: str) -> str:
        """The screen once ``text`` is on it (at most 10 s)."""
        async with asyncio.timeout(10):
            while text not in self.text:
                self._changed.clear()
                if self.exit is not None:
                    raise AssertionError(f"ended without {text!r}: {self.text!r}")
                await self._changed.wait()
        return self.text

    async def ended(self) -> ExecExit:
        await asyncio.wait_for(self._task, 10)
        assert self.exit is not None
        return self.exit


async def terminal(crun: CrunBackend, sandbox_id: str, cmd: list[str], **kw: object) -> Screen:
    request = ExecRequest.model_validate(
        {"cmd": cmd, "pty": {"cols": 80, "rows": 24}, "timeout_s": 30, **kw}
    )
    return Screen(await crun.exec(sandbox_id, request, default_user="user"))


async def test_a_shell_on_a_terminal_of_the_sandboxs_own_takes_input_and_resizes(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-pty"), busybox_image)
    screen = await terminal(crun, "sbx-pty", ["sh"])
    await screen.process.write_stdin(
        b"trap 'echo WINCH' WINCH; tty; stat -c '%U %a' $(tty); echo $TERM; stty size; "
        b"echo $((6*7))\n"
    )
    text = await screen.shows("42\r\n")
    # its own devpts (the sandbox's first terminal), the user's, sized as asked
    assert "/dev/pts/0\r\n" in text and "user 620\r\n" in text
    assert "xterm-256color\r\n" in text and "24 80\r\n" in text
    await screen.process.resize(PtySize(cols=132, rows=50))
    await screen.shows("WINCH")
    await screen.process.write_stdin(b"stty size; exit 3\n")
    await screen.shows("50 132\r\n")
    end = await screen.ended()
    assert end.exit_code == 3 and screen.streams == {"pty"}


async def test_a_terminal_is_the_commands_controlling_terminal(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-ctty"), busybox_image)
    # /dev/tty opens only for a process with a controlling terminal; ^C from it is SIGINT
    screen = await terminal(crun, "sbx-ctty", ["sh", "-c", "echo via-tty >/dev/tty; sleep 20"])
    await screen.shows("via-tty")
    await screen.process.write_stdin(b"\x03")
    end = await screen.ended()
    assert end.signal == signal.SIGINT or end.exit_code == 128 + signal.SIGINT


async def test_a_terminal_is_killed_with_its_session(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-ptykill"), busybox_image)
    screen = await terminal(crun, "sbx-ptykill", ["sh"])
    await screen.process.write_stdin(b"sleep 100 & echo started\n")
    await screen.shows("started\r\n")
    await screen.process.signal(signal.SIGKILL)
    end = await screen.ended()
    assert end.signal == signal.SIGKILL
    left = await crun.exec(
        "sbx-ptykill",
        ExecRequest(cmd=["sh", "-c", "ps -o comm | grep -c sleep"]),
        default_user="user",
    )
    outputs = [e async for e in left.events() if isinstance(e, ExecOutput)]
    assert b"".join(o.data for o in outputs).strip() == b"0"


async def test_a_terminals_flood_past_its_cap_is_dropped_and_the_command_ends(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-ptyflood"), busybox_image)
    screen = await terminal(
        crun, "sbx-ptyflood", ["sh", "-c", "seq 1 200000; exit 4"], max_output_bytes=1000
    )
    end = await screen.ended()
    assert end.exit_code == 4 and not end.timed_out and end.stdout_truncated
    assert len(screen.text.encode()) <= 1000


async def test_a_process_without_a_terminal_cannot_be_resized(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-nopty"), busybox_image)
    process = await crun.exec(
        "sbx-nopty", ExecRequest(cmd=["sleep", "5"], timeout_s=10), default_user="user"
    )
    with pytest.raises(NotATerminal):
        await process.resize(PtySize(cols=10, rows=10))
    await process.signal(signal.SIGKILL)
    async for _ in process.events():
        pass
