"""The real guest agent (compiled for the host, run as an ordinary process whose two ports
are socketpairs) through ``AgentChannel``: commands, credit, terminals, files, users, and
hostile or malformed peers."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from node.sandboxes.microvm.channel import AgentChannel, AgentError, GuestProcess
from node.sandboxes.microvm.frames import (
    WINDOW,
    FrameType,
)
from tests.node.sandboxes.microvm.conftest import Agent, alive, wait_gone
from tests.requirements import missing

T = FrameType
PATH = "/usr/local/bin:/usr/bin:/bin"


async def start(
    channel: AgentChannel,
    *argv: str,
    env: dict[str, str] | None = None,
    cwd: str = "/",
    user: str = "0",
    stdin: bool = False,
    pty: tuple[int, int] | None = None,
) -> GuestProcess:
    return await channel.exec(
        argv=list(argv),
        env={"PATH": PATH} if env is None else env,
        cwd=cwd,
        user=user,
        stdin=stdin,
        pty=pty,
    )


async def collect(process: GuestProcess) -> tuple[bytes, bytes, int]:
    out, err = bytearray(), bytearray()
    status = -1
    async for kind, value in process.events():
        if kind == "exit":
            assert isinstance(value, int)
            status = value
        else:
            assert isinstance(value, bytes)
            (out if kind == "stdout" else err).extend(value)
    return bytes(out), bytes(err), status


async def run(channel: AgentChannel, *argv: str, **kwargs: object) -> tuple[bytes, bytes, int]:
    process = await start(channel, *argv, **kwargs)  # type: ignore[arg-type]
    try:
        return await collect(process)
    finally:
        await process.release()


async def test_hello_and_ping(agent: Agent) -> None:
    await agent.channel.hello(
        time_ns=1, entropy=os.urandom(64), hostname="vm", machine_id="ab" * 16
    )
    assert await agent.channel.ping(10) >= 0
    assert not agent.channel.closed


async def test_exec_output_and_status(agent: Agent) -> None:
    out, err, status = await run(agent.channel, "sh", "-c", "echo out; echo err >&2; exit 3")
    assert (out, err) == (b"out\n", b"err\n")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3


async def test_environment_is_exact(agent: Agent) -> None:
    env = {"A": "1", "B": "x=y", "EMPTY": ""}
    out, _, status = await run(agent.channel, "/usr/bin/env", env=env)
    assert status == 0
    assert sorted(out.decode().splitlines()) == ["A=1", "B=x=y", "EMPTY="]


async def test_cwd(agent: Agent, tmp_path: Path) -> None:
    out, _, status = await run(agent.channel, "pwd", cwd=str(tmp_path))
    assert (out, status) == (f"{tmp_path}\n".encode(), 0)


async def test_stdin_round_trip_beyond_the_window(agent: Agent) -> None:
    payload = os.urandom(3 * WINDOW + 12345)
    process = await start(agent.channel, "cat", stdin=True)
    try:

        async def feed() -> None:
            await process.write_stdin(payload)
            await process.close_stdin()

        feeder = asyncio.create_task(feed())
        out, err, status = await collect(process)
        await feeder
    finally:
        await process.release()
    assert (out == payload, err, status) == (True, b"", 0)


async def test_missing_program(agent: Agent) -> None:
    _, err, status = await run(agent.channel, "no-such-program-here")
    assert os.WEXITSTATUS(status) == 127
    assert b"no-such-program-here" in err and b"not found" in err


async def test_not_executable(agent: Agent, tmp_path: Path) -> None:
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    _, err, status = await run(agent.channel, str(script))
    assert os.WEXITSTATUS(status) == 126
    assert b"Permission denied" in err


async def test_signal_reaches_the_whole_session(agent: Agent) -> None:
    process = await start(agent.channel, "sh", "-c", "sleep 1000 & echo $!; wait")
    try:
        events = process.events()
        kind, value = await anext(events)
        assert kind == "stdout" and isinstance(value, bytes)
        child = int(value)
        assert alive(child)
        await process.signal(15)
        kind, status = await anext(events)
        assert kind == "exit" and isinstance(status, int)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 15
        assert not await wait_gone({child})
    finally:
        await process.release()


async def test_flood_does_not_delay_ping_and_stays_bounded(agent: Agent) -> None:
    process = await start(agent.channel, "yes")
    try:
        for _ in range(400):
            if process.buffered >= WINDOW:
                break
            await asyncio.sleep(0.025)
        assert process.buffered == WINDOW  # the window is full: the guest stops there
        for _ in range(5):
            await agent.channel.ping(10)
        assert process.buffered == WINDOW
        events = process.events()
        kind, _ = await anext(events)  # taking bytes grants credit: more comes
        assert kind == "stdout"
    finally:
        await process.release()


async def test_release_kills_a_running_command(agent: Agent) -> None:
    process = await start(agent.channel, "sh", "-c", "echo $$; exec sleep 1000")
    kind, value = await anext(process.events())
    assert kind == "stdout" and isinstance(value, bytes)
    await process.release()
    assert not await wait_gone({int(value)})
    assert await agent.channel.ping(10) >= 0


async def test_pty_and_resize(agent: Agent) -> None:
    process = await start(
        agent.channel, "sh", "-c", "stty size; read x; stty size", stdin=True, pty=(80, 24)
    )
    try:
        events = process.events()
        seen = bytearray()
        while b"24 80" not in seen:
            kind, value = await anext(events)
            assert kind == "stdout" and isinstance(value, bytes)
            seen += value
        await process.resize(100, 30)
        await process.write_stdin(b"\n")
        out, err, status = await collect(process)
        assert b"30 100" in out and err == b"" and status == 0
    finally:
        await process.release()


async def test_resize_without_a_terminal(agent: Agent) -> None:
    process = await start(agent.channel, "true")
    try:
        with pytest.raises(AgentError) as caught:
            await process.resize(10, 10)
        assert caught.value.code == "not_a_terminal"
    finally:
        await process.release()


async def test_no_such_user(agent: Agent) -> None:
    with pytest.raises(AgentError) as caught:
        await start(agent.channel, "true", user="no-such-user-here")
    assert caught.value.code == "no_such_user"


async def test_exec_as_another_user(agent: Agent) -> None:
    if os.geteuid() != 0:
        missing("taking another user needs root")
    out, _, status = await run(agent.channel, "id", "-u", user="1000:1000")
    assert (out, status) == (b"1000\n", 0)
