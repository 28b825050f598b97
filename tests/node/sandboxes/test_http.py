"""The node's sandbox API with real containers, called as a gateway calls it
(``NodeClient``): a command's output reaches the gateway byte for byte, through ``exec``
and through the process table, a character cut by a 64 KiB read and bytes that are not
text alike."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from starlette.applications import Starlette

from app.errors import Conflict
from app.sandboxes.nodes import NodeClient
from node.agent import local
from node.sandboxes.base import RootImage
from node.sandboxes.crun.process import READ_CHUNK
from node.sandboxes.http import sandbox_routes
from node.sandboxes.manager import SandboxManager
from tests.node.sandboxes.conftest import spec, started_backend, write_file
from wire.processes import StartProcess
from wire.sandboxes import ExecExit, ExecOutput, ExecRequest, ExecStarted, PtySize, collect

pytestmark = pytest.mark.crun

ADDRESS = "unix:/nonexistent/corral-test/sandbox-node.sock"  # served in this process only
TOKEN = "node-token"
#: a character cut by the first 64 KiB read, then 3-byte characters throughout (any read
#: that ends at a length not a multiple of 3 cuts one)
SPLIT = b"a" * (READ_CHUNK - 1) + "€".encode() * 100_000
BINARY = os.urandom(300_000)


@pytest_asyncio.fixture
async def node(tmp_path: Path, busybox_image: RootImage) -> AsyncIterator[NodeClient]:
    """A node's sandbox API on the container backend, one sandbox holding both outputs."""
    async with started_backend(tmp_path / "data") as backend:
        manager = SandboxManager(
            {"crun": backend}, lambda ref: busybox_image, state_dir=tmp_path / "records"
        )
        await manager.start()
        app = Starlette(routes=sandbox_routes(manager, TOKEN, node_id="n1"))
        try:
            with local.published(ADDRESS, app):
                client = NodeClient("n1", ADDRESS, TOKEN)
                try:
                    await client.create(spec("sbx-bytes"))
                    await write_file(backend, "sbx-bytes", "/home/user/split", SPLIT)
                    await write_file(backend, "sbx-bytes", "/home/user/binary", BINARY)
                    yield client
                finally:
                    await client.close()
        finally:
            await manager.destroy_all("test over")
            await manager.close()


@pytest.mark.parametrize(("path", "expected"), [("split", SPLIT), ("binary", BINARY)])
async def test_exec_output_reaches_the_gateway_byte_for_byte(
    node: NodeClient, path: str, expected: bytes
) -> None:
    request = ExecRequest(cmd=["sh", "-c", f"cat {path}; cat {path} >&2"])
    result = await collect(node.exec("sbx-bytes", request))
    assert result.exit_code == 0
    assert result.stdout == expected and result.stderr == expected


async def test_a_background_process_output_reaches_the_gateway_byte_for_byte(
    node: NodeClient,
) -> None:
    start = StartProcess(request=ExecRequest(cmd=["sh", "-c", "cat split binary"]))
    result = await collect(node.start_process("sbx-bytes", start))
    assert result.exit_code == 0 and result.stdout == SPLIT + BINARY


async def test_a_terminal_through_the_nodes_api_takes_input_resizes_and_is_killed(
    node: NodeClient,
) -> None:
    request = ExecRequest(cmd=["sh"], pty=PtySize(cols=80, rows=24), timeout_s=30)
    events = aiter(node.start_process("sbx-bytes", StartProcess(request=request)))
    started = await anext(events)
    assert isinstance(started, ExecStarted)
    seen = b""

    async def until(text: bytes) -> None:
        nonlocal seen
        while text not in seen:
            event = await asyncio.wait_for(anext(events), 10)
            assert isinstance(event, ExecOutput) and event.stream == "pty"
            seen += event.data

    await node.write_stdin("sbx-bytes", started.pid, b"stty size\n")
    await until(b"24 80\r\n")
    await node.resize("sbx-bytes", started.pid, PtySize(cols=100, rows=30))
    await node.write_stdin("sbx-bytes", started.pid, b"stty size\n")
    await until(b"30 100\r\n")
    await node.signal_process("sbx-bytes", started.pid, int(signal.SIGKILL))
    rest = [event async for event in events]
    assert isinstance(rest[-1], ExecExit) and rest[-1].signal == signal.SIGKILL


async def test_resizing_a_process_without_a_terminal_is_a_conflict(node: NodeClient) -> None:
    request = ExecRequest(cmd=["sleep", "30"], timeout_s=30)
    events = aiter(node.start_process("sbx-bytes", StartProcess(request=request)))
    started = await anext(events)
    assert isinstance(started, ExecStarted)
    with pytest.raises(Conflict, match="no terminal"):
        await node.resize("sbx-bytes", started.pid, PtySize(cols=100, rows=30))
    await node.signal_process("sbx-bytes", started.pid, int(signal.SIGKILL))
    assert [event async for event in events]
