"""The node's side of the spawn handshake with a sandbox's init, against a fake init that
answers what root inside could make a hijacked init answer: whatever it sends is parsed
as untrusted data, bounded, and ends the command as killed, never as a result the node
believes; an init that says nothing fails the command in bounded time (review #8)."""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from node.sandboxes.base import SandboxUnresponsive
from node.sandboxes.crun import spawn
from wire.sandboxes import PtySize

KILLED = -int(signal.SIGKILL)
#: starts a fake init that handles one connection as the behaviour given says
FakeInit = Callable[[Callable[[socket.socket], None]], Path]


@pytest.fixture
def fake_init(tmp_path: Path) -> Iterator[FakeInit]:
    """Start a fake init at ``<tmp>/spawn.sock`` that handles one connection with the
    given behaviour (on a thread, as a real init is another process)."""
    threads: list[threading.Thread] = []
    listeners: list[socket.socket] = []

    def start(behave: Callable[[socket.socket], None]) -> Path:
        path = tmp_path / spawn.SOCKET_NAME
        listening = spawn.listener(path)
        listeners.append(listening)

        def serve() -> None:
            conn, _ = listening.accept()
            with conn:
                conn.recv(1 << 16)  # the request (its descriptors are dropped with it)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    behave(conn)  # the node may stop reading, as it should

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        threads.append(thread)
        return path

    yield start
    for listening in listeners:
        listening.close()
    for thread in threads:
        thread.join(timeout=5)


async def started(path: Path) -> spawn.Spawned:
    return await spawn.spawn(path, ["true"], env={}, uid=1000, gid=1000, cwd="/")


async def test_a_garbage_answer_ends_the_command_as_killed(fake_init: FakeInit) -> None:
    path = fake_init(lambda conn: conn.sendall(b"Z" + b"forged result " * 100_000))
    process = await started(path)
    assert await asyncio.wait_for(process.wait(), 5) == KILLED
    process.close()


async def test_a_forged_end_after_the_start_is_not_believed(fake_init: FakeInit) -> None:
    # 'P', then an end record of the wrong kind and a status that would read as exit 0
    path = fake_init(lambda conn: conn.sendall(b"PQ\x00\x00\x00\x00"))
    process = await started(path)
    assert process.pid > 0  # the kernel's credentials, not the answer's words
    assert await asyncio.wait_for(process.wait(), 5) == KILLED
    process.close()


async def test_an_init_that_closes_after_the_start_ends_the_command_as_killed(
    fake_init: FakeInit,
) -> None:
    path = fake_init(lambda conn: conn.sendall(b"P"))
    process = await started(path)
    assert await asyncio.wait_for(process.wait(), 5) == KILLED
    process.close()


async def test_a_refusal_is_a_clear_error(fake_init: FakeInit) -> None:
    path = fake_init(lambda conn: conn.sendall(b"E"))
    with pytest.raises(spawn.SpawnRefused):
        await started(path)


async def test_an_init_that_never_answers_fails_the_command_in_bounded_time(
    fake_init: FakeInit, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spawn, "START_S", 0.3)
    hold = threading.Event()
    path = fake_init(lambda conn: hold.wait(5))
    with pytest.raises(SandboxUnresponsive, match="did not start the command"):
        await asyncio.wait_for(started(path), 5)
    hold.set()


async def test_a_terminal_must_come_as_a_terminals_master_or_the_command_is_refused(
    fake_init: FakeInit, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a hijacked init answers a terminal's request with a pipe (it could be any file)
    read_end, write_end = os.pipe()
    killed: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, signum: killed.append((pid, signum)))

    def forged(conn: socket.socket) -> None:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [read_end]))]
        conn.sendmsg([b"P"], rights)
        os.close(read_end)

    path = fake_init(forged)
    with pytest.raises(spawn.SpawnRefused, match="no terminal"):
        await spawn.spawn(
            path, ["sh"], env={}, uid=1000, gid=1000, cwd="/", pty=PtySize(cols=80, rows=24)
        )
    assert killed and killed[0][1] == signal.SIGKILL  # the command it says it started
    with pytest.raises(BrokenPipeError):  # the node kept no descriptor of the pipe
        os.write(write_end, b"x")
    os.close(write_end)


def test_only_a_terminals_master_is_taken(tmp_path: Path) -> None:
    master, slave = os.openpty()
    read_end, write_end = os.pipe()
    (tmp_path / "file").write_text("x")
    plain = os.open(tmp_path / "file", os.O_RDWR)
    try:
        assert spawn.is_master(master)
        assert not any(spawn.is_master(fd) for fd in (slave, read_end, write_end, plain))
    finally:
        for fd in (master, slave, read_end, write_end, plain):
            os.close(fd)
