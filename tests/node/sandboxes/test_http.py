"""The node's sandbox API with real containers, called as a gateway calls it
(``NodeClient``): a command's output reaches the gateway byte for byte, through ``exec``
and through the process table, a character cut by a 64 KiB read and bytes that are not
text alike."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from starlette.applications import Starlette

from app.sandboxes.nodes import NodeClient
from node.agent import local
from node.sandboxes.base import RootImage
from node.sandboxes.crun.process import READ_CHUNK
from node.sandboxes.http import sandbox_routes
from node.sandboxes.manager import SandboxManager
from tests.node.sandboxes.conftest import spec, started_backend, write_file
from wire.processes import StartProcess
from wire.sandboxes import ExecRequest, collect

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
