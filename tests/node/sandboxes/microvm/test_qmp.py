"""The QMP client against a scripted monitor: greeting and capabilities, replies matched
by id with events queued meanwhile, errors, descriptors passed with a command, and the
bounds on what the peer may send. Also the serial log's size cap."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from node.sandboxes.microvm import qmp as qmp_module
from node.sandboxes.microvm.qemu import _CappedLog
from node.sandboxes.microvm.qmp import Qmp, QmpError

GREETING = b'{"QMP": {"version": {}, "capabilities": []}}\r\n'

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def monitor(tmp_path: Path) -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    servers: list[asyncio.Server] = []

    async def serve(handler: Handler) -> str:
        path = str(tmp_path / f"qmp{len(servers)}.sock")
        servers.append(await asyncio.start_unix_server(handler, path))
        return path

    try:
        yield serve
    finally:
        for server in servers:
            server.close()
            await server.wait_closed()


async def read_command(reader: asyncio.StreamReader) -> dict[str, object]:
    return dict(json.loads(await reader.readline()))


async def test_commands_get_their_replies_and_events_are_queued(
    monitor: Callable[[Handler], Awaitable[str]],
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(GREETING)
        caps = await read_command(reader)
        assert caps["execute"] == "qmp_capabilities"
        writer.write(json.dumps({"return": {}, "id": caps["id"]}).encode() + b"\r\n")
        cmd = await read_command(reader)
        # an event and a stray reply come first, then the command's own reply
        writer.write(b'{"event": "STOP", "data": {}}\r\n')
        writer.write(b'{"return": "not yours", "id": "other"}\r\n')
        writer.write(json.dumps({"return": {"status": "running"}, "id": cmd["id"]}).encode())
        writer.write(b"\r\n")
        cmd = await read_command(reader)
        writer.write(json.dumps({"error": {"desc": "no"}, "id": cmd["id"]}).encode() + b"\n")
        writer.write(b'{"event": "SHUTDOWN", "data": {"reason": "guest-reset"}}\n')
        await writer.drain()
        writer.close()

    q = await Qmp.connect(await monitor(handler))
    try:
        assert await q.execute("query-status") == {"status": "running"}
        assert [e["event"] for e in q.events] == ["STOP"]
        with pytest.raises(QmpError, match="cont: no"):
            await q.execute("cont")
        event = await q.wait_event("SHUTDOWN", timeout=5)
        assert event["data"] == {"reason": "guest-reset"}
        with pytest.raises(QmpError, match=r"closed|failed"):
            await q.execute("query-status")
    finally:
        q.close()


def serve_one_getfd(server: socket.socket, received: list[bytes]) -> None:
    """A blocking monitor (no event loop reading ahead of recv_fds): greeting,
    capabilities, then one command with its descriptors."""
    conn, _ = server.accept()
    with conn, conn.makefile("rb") as lines:
        conn.sendall(GREETING)
        caps = json.loads(lines.readline())
        conn.sendall(json.dumps({"return": {}, "id": caps["id"]}).encode() + b"\n")
        msg, fds, _, _ = socket.recv_fds(conn, 4096, 4)
        for fd in fds:
            with os.fdopen(fd, "rb") as f:
                received.append(f.read())
        cmd = json.loads(msg)
        conn.sendall(json.dumps({"return": {}, "id": cmd["id"]}).encode() + b"\n")


async def test_a_descriptor_goes_with_its_command(tmp_path: Path) -> None:
    received: list[bytes] = []
    path = str(tmp_path / "qmp.sock")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen(1)
        serving = asyncio.create_task(asyncio.to_thread(serve_one_getfd, server, received))
        secret = tmp_path / "state"
        secret.write_bytes(b"passed")
        q = await Qmp.connect(path, timeout=5)
        try:
            fd = os.open(secret, os.O_RDONLY)
            try:
                assert await q.execute("getfd", {"fdname": "state"}, fds=[fd]) == {}
            finally:
                os.close(fd)
        finally:
            q.close()
            async with asyncio.timeout(10):
                await serving
    assert received == [b"passed"]


@pytest.mark.parametrize(
    "sent",
    [
        b"x" * (qmp_module.MAX_LINE + 70000),  # a line without end
        b"[1, 2]\n",  # not an object
        b"{not json\n",
    ],
)
async def test_a_monitor_breaking_the_protocol_ends_the_connection(
    monitor: Callable[[Handler], Awaitable[str]], sent: bytes
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(sent)
        try:
            await writer.drain()
            await reader.read()
        except ConnectionError:
            pass
        writer.close()

    with pytest.raises(QmpError):
        await Qmp.connect(await monitor(handler), timeout=5)


async def test_no_monitor_is_an_error_in_time(tmp_path: Path) -> None:
    with pytest.raises(QmpError, match="no QMP socket"):
        await Qmp.connect(str(tmp_path / "absent.sock"), timeout=0.1)


def test_the_serial_log_keeps_at_most_its_cap_with_the_newest_output(tmp_path: Path) -> None:
    log = _CappedLog(tmp_path / "serial.log", 16384)
    try:
        for i in range(1000):
            log.write(f"line {i:04d} ".encode() * 10)
    finally:
        log.close()
    current = (tmp_path / "serial.log").read_bytes()
    older = (tmp_path / "serial.log.1").read_bytes()
    assert len(current) <= 8192 and len(older) == 8192
    assert current.endswith(b"line 0999 ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["serial.log", "serial.log.1"]
