"""``WorkerProcess.request`` against a real child process speaking the frame protocol:
each reply resolves its own request, a request unanswered in its timeout fails alone,
and a worker that exits fails everything in flight."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from node.fncall.nsjail.cgroups import CgroupMode, CgroupSetup
from node.fncall.wasm.config import WasmConfig
from node.fncall.wasm.worker import WorkerDied, WorkerProcess

pytestmark = pytest.mark.asyncio

ROOT = Path(__file__).resolve().parents[4]

#: A stand-in worker: ``echo`` is answered at once, ``later`` after the next frame,
#: ``hang`` never, ``exit`` ends the process.
FAKE_WORKER = """
import sys
from node.fncall.wasm.protocol import HEADER, encode
import json

held = []
while True:
    header = sys.stdin.buffer.read(HEADER.size)
    if not header:
        break
    size, blob = HEADER.unpack(header)
    msg = json.loads(sys.stdin.buffer.read(size))
    sys.stdin.buffer.read(blob)
    op = msg["op"]
    if op == "exit":
        sys.exit(3)
    out = [m for m in held]
    held.clear()
    if op == "echo":
        out.append(msg)
    elif op == "later":
        held.append(msg)
    for m in out:
        sys.stdout.buffer.write(encode({"op": "reply", "id": m["id"], "echo": m.get("n")}))
    sys.stdout.buffer.flush()
"""


@pytest.fixture
async def worker(tmp_path: Path) -> AsyncIterator[WorkerProcess]:
    statuses: list[dict[str, Any]] = []
    process = WorkerProcess(
        WasmConfig(data_dir=tmp_path / "data"),
        CgroupSetup(mode=CgroupMode.OFF, parent="corral-test"),
        on_status=statuses.append,
    )
    await process._launch([sys.executable, "-c", FAKE_WORKER], env={"PYTHONPATH": str(ROOT)})
    yield process
    process.kill()
    await process.close(5.0)


async def test_replies_resolve_their_own_requests(worker: WorkerProcess) -> None:
    first = asyncio.create_task(worker.request({"op": "later", "n": 1}, timeout=10))
    await asyncio.sleep(0.05)
    second = await worker.request({"op": "echo", "n": 2}, timeout=10)
    assert second["echo"] == 2
    assert (await first)["echo"] == 1
    assert worker._pending == {}


async def test_an_unanswered_request_times_out_alone(worker: WorkerProcess) -> None:
    with pytest.raises(TimeoutError):
        await worker.request({"op": "hang"}, timeout=0.2)
    assert worker._pending == {}
    assert worker.alive
    assert (await worker.request({"op": "echo", "n": 5}, timeout=10))["echo"] == 5


async def test_a_cancelled_request_leaves_nothing_pending(worker: WorkerProcess) -> None:
    waiting = asyncio.create_task(worker.request({"op": "later", "n": 1}, timeout=10))
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert worker._pending == {}
    # the worker answers the cancelled request now: the reply is dropped, this one served
    assert (await worker.request({"op": "echo", "n": 7}, timeout=10))["echo"] == 7


async def test_a_worker_that_exits_fails_every_request_in_flight(worker: WorkerProcess) -> None:
    hanging = asyncio.create_task(worker.request({"op": "hang"}, timeout=30))
    await asyncio.sleep(0.05)
    with pytest.raises(WorkerDied):
        await worker.request({"op": "exit"}, timeout=30)
    with pytest.raises(WorkerDied):
        await hanging
    assert not worker.alive
