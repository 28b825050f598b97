"""The ``e2b`` SDK's ``sandbox.pty``, unchanged, against Corral on crun: a login shell on a
terminal of the sandbox's own, fed, resized (``stty size`` follows), followed by a second
handle and killed."""

from __future__ import annotations

import asyncio

import pytest
from e2b import AsyncSandbox, CommandExitException, PtySize

from tests.app.api.e2b.conftest import Corral

pytestmark = [pytest.mark.crun, pytest.mark.slow]


class Screen:
    """A terminal's output as the SDK's ``on_data`` hands it over."""

    def __init__(self) -> None:
        self.data = b""
        self._changed = asyncio.Event()

    def feed(self, data: bytes) -> None:
        self.data += data
        self._changed.set()

    async def shows(self, text: bytes) -> None:
        async with asyncio.timeout(20):
            while text not in self.data:
                self._changed.clear()
                await self._changed.wait()


async def test_a_pty_is_created_fed_resized_followed_and_killed(corral: Corral) -> None:
    sbx = await AsyncSandbox.create(template="python", timeout=120)
    try:
        screen = Screen()
        terminal = await sbx.pty.create(PtySize(rows=24, cols=80), on_data=screen.feed)
        await sbx.pty.send_stdin(terminal.pid, b"tty; echo $TERM; stty size\n")
        await screen.shows(b"24 80\r\n")
        assert b"/dev/pts/" in screen.data and b"xterm-256color\r\n" in screen.data

        await sbx.pty.resize(terminal.pid, PtySize(rows=40, cols=100))
        await sbx.pty.send_stdin(terminal.pid, b"stty size\n")
        await screen.shows(b"40 100\r\n")

        follower = Screen()
        again = await sbx.pty.connect(terminal.pid, on_data=follower.feed)
        await sbx.pty.send_stdin(terminal.pid, b"echo $((6*7))\n")
        await follower.shows(b"42\r\n")

        assert await sbx.pty.kill(terminal.pid) is True
        with pytest.raises(CommandExitException):
            await terminal.wait()
        with pytest.raises(CommandExitException):
            await again.wait()
        assert await sbx.commands.list() == []
    finally:
        await sbx.kill()


async def test_a_pty_exits_with_its_shells_code(corral: Corral) -> None:
    sbx = await AsyncSandbox.create(template="python", timeout=120)
    try:
        screen = Screen()
        terminal = await sbx.pty.create(PtySize(rows=10, cols=40), on_data=screen.feed)
        await sbx.pty.send_stdin(terminal.pid, b"exit 0\n")
        result = await terminal.wait()
        assert result.exit_code == 0
    finally:
        await sbx.kill()
