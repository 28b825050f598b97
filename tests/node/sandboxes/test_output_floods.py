"""Output nobody reads costs the node nothing (issue 29, review finding #11), on crun and
runc: a foreground exec past its cap is drained by the kernel and still ends with its
own exit code; a background command nobody follows stops being drained once its buffer
is full (it blocks in write, as on a full pipe), and a follower that comes later gets
what was buffered. The node's CPU is measured over a window as a bound on what the
flood costs it, never a latency."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from node.sandboxes.base import RootImage
from node.sandboxes.crun.backend import CrunBackend
from node.sandboxes.manager import SandboxManager
from node.sandboxes.processes import BUFFER_BYTES, ProcessTable
from tests.node.sandboxes.conftest import spec, started_backend
from wire.processes import StartProcess
from wire.sandboxes import ExecOutput, ExecRequest, ExecStarted, collect

pytestmark = pytest.mark.crun

#: the node's CPU over a flood's window, at most this share of the window (reading a
#: flood in Python took 0.6-0.9 of it)
CPU_SHARE = 0.25


@pytest_asyncio.fixture(params=["crun", "runc"])
async def crun(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[CrunBackend]:
    async with started_backend(tmp_path / "data", runtime=request.param) as backend:
        assert backend.runtime == request.param
        yield backend


def node_cpu_s() -> float:
    """CPU time of this process (the node: the backend runs in it), all threads."""
    return time.process_time()


async def test_an_exec_printing_10_mib_then_exit_3_returns_3_truncated(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-ten"), busybox_image)
    process = await crun.exec(
        "sbx-ten",
        ExecRequest(cmd=["sh", "-c", "head -c 10485760 /dev/zero; echo done >&2; exit 3"]),
        default_user="user",
    )
    result = await collect(process.events())
    assert result.exit_code == 3 and result.signal is None and not result.timed_out
    assert result.stdout_truncated and len(result.stdout) == 4 << 20  # the default cap
    assert result.stderr.decode() == "done\n" and not result.stderr_truncated


async def test_an_unread_flood_past_the_cap_is_drained_by_the_kernel(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    """``yes`` for a few seconds, far past its cap: the node's CPU stays a small share of
    the window (the kernel discards the rest), and the command ends at its timeout."""
    await crun.create(spec("sbx-yes"), busybox_image)
    window_s = 3.0
    process = await crun.exec(
        "sbx-yes",
        ExecRequest(cmd=["yes"], timeout_s=window_s, max_output_bytes=1 << 20),
        default_user="user",
    )
    cpu, wall = node_cpu_s(), time.monotonic()
    result = await collect(process.events())
    cpu, wall = node_cpu_s() - cpu, time.monotonic() - wall
    assert result.timed_out and result.stdout_truncated and len(result.stdout) == 1 << 20
    assert cpu < CPU_SHARE * wall, f"the node spent {cpu:.2f} CPU-s in {wall:.2f} s"


def _state_and_wchan(host_pid: int) -> tuple[str, str]:
    stat = Path(f"/proc/{host_pid}/stat").read_text()
    wchan = Path(f"/proc/{host_pid}/wchan").read_text()
    return stat.rsplit(")", 1)[1].split()[0], wchan


async def test_an_unread_background_yes_blocks_in_write_and_costs_the_node_nothing(
    crun: CrunBackend, busybox_image: RootImage, tmp_path: Path
) -> None:
    manager = SandboxManager(
        {"crun": crun}, lambda ref: busybox_image, state_dir=tmp_path / "records"
    )
    await manager.start()
    table = ProcessTable(manager)
    try:
        await manager.create(spec("sbx-bg"))
        request = ExecRequest(cmd=["yes"], timeout_s=None, max_output_bytes=64 << 20)
        events = await table.start("sbx-bg", StartProcess(request=request))
        first = await anext(events)  # the starter reads its first event, then nothing
        assert isinstance(first, ExecStarted)
        [running] = table._running["sbx-bg"].values()
        host_pid = running.process.host_pid  # type: ignore[attr-defined]

        for _ in range(500):  # until the command blocks writing to its full pipe
            await asyncio.sleep(0.02)
            state, wchan = _state_and_wchan(host_pid)
            if state == "S" and "pipe" in wchan:
                break
        assert (state, "pipe" in wchan) == ("S", True), (state, wchan)

        cpu, wall = node_cpu_s(), time.monotonic()
        await asyncio.sleep(2.0)
        cpu, wall = node_cpu_s() - cpu, time.monotonic() - wall
        assert cpu < CPU_SHARE * wall, f"the node spent {cpu:.2f} CPU-s in {wall:.2f} s"
        assert _state_and_wchan(host_pid)[0] == "S"  # still blocked: nobody drains it

        # nobody else follows: what the starter did not take is its to take, bounded
        held = (
            sum(len(e.data) for e in list(_queued(running)) if isinstance(e, ExecOutput))
            + running.backlog_bytes
        )
        assert held <= BUFFER_BYTES + (4 + 2) * 64 * 1024
        await events.aclose()  # the starter goes away: the rest waits for the next one

        later = table.follow("sbx-bg", running.pid)
        assert isinstance(await anext(later), ExecStarted)
        got = 0
        while got < 4 * BUFFER_BYTES:  # reading lets it write again, past the buffer
            event = await anext(later)
            assert isinstance(event, ExecOutput) and set(event.data) <= set(b"y\n")
            got += len(event.data)
        await later.aclose()
        await table.signal("sbx-bg", running.pid, 9)
    finally:
        await table.close()
        await manager.close()


def _queued(running: object) -> list[object]:
    """Events waiting in the followers' queues."""
    found: list[object] = []
    for follower in running.followers:  # type: ignore[attr-defined]
        found += list(follower.queue._queue)
    return found
