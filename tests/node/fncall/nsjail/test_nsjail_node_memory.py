"""The jails of a node share one memory limit (their parent cgroup's): when programs that
each stay within their own limit together outgrow it, the out-of-memory killer picks
among the jails, never the host's other processes, and the answer says the node ran out,
not the program. Real jails, under a parent cgroup of this module's own."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from node.fncall.nsjail import NsjailBackend, NsjailConfig
from node.fncall.nsjail.cgroups import CgroupMode, detect
from tests.node.fncall.nsjail.conftest import RunFn, make_runtime
from wire.execution import StageStatus

pytestmark = [pytest.mark.nsjail, pytest.mark.asyncio(loop_scope="module")]

PARENT = f"CORRAL-TEST-MEM-{os.getpid()}"
JAILS_MB = 320

#: 200 MB, every page touched, held for a while: within the jail's own 512 MB
HOLD = (
    "import time\n"
    "block = bytearray(200 * 1024 * 1024)\n"
    "block[::4096] = b'x' * len(block[::4096])\n"
    "time.sleep(1.5)\n"
    "print('held')\n"
)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shared() -> AsyncIterator[NsjailBackend]:
    setup = detect(NsjailConfig(cgroup_parent=PARENT))
    if setup.mode is not CgroupMode.V1:
        pytest.fail(f"this machine's cgroups are {setup.mode}; the test needs v1 here")
    rt = make_runtime(languages=["python"], cgroup_parent=PARENT, jails_memory_mb=JAILS_MB)
    await rt.start()
    try:
        yield rt
    finally:
        await rt.close()
        for mount in (setup.memory, setup.pids, setup.cpu, setup.cpuacct):
            if mount is not None:
                with contextlib.suppress(OSError):
                    (mount / PARENT).rmdir()


async def test_the_parent_cgroup_holds_the_jails_limit(shared: NsjailBackend) -> None:
    setup = detect(NsjailConfig(cgroup_parent=PARENT))
    assert setup.memory is not None
    limit = Path(setup.memory / PARENT / "memory.limit_in_bytes").read_text()  # noqa: ASYNC240
    assert int(limit) == JAILS_MB * 1024 * 1024


async def test_jails_outgrowing_the_node_together_lose_one_and_say_why(
    run: RunFn, shared: NsjailBackend
) -> None:
    tenants = ["mem-a", "mem-b", "mem-c"]
    # one warm jail per tenant first, so the three programs below run at the same time
    await asyncio.gather(*(run(shared, "pass", tenant=t) for t in tenants))
    results = await asyncio.gather(
        *(run(shared, HOLD, tenant=t, memory_mb=512, run_timeout_s=20.0) for t in tenants)
    )
    held = [r for r in results if r.run is not None and r.run.ok]
    lost = [r for r in results if not (r.run is not None and r.run.ok)]
    assert lost, "600 MB fitted in a 320 MB parent"
    assert held, results  # the kernel chose victims among them; the others went on
    for result in lost:
        said = result.error or (result.run.message if result.run else "") or ""
        assert "node's jails together ran out of memory" in said, result
        if result.run is not None:
            assert result.run.status is StageStatus.KILLED, result.run
    # the node keeps serving
    after = await run(shared, "print('ok')", tenant="mem-a")
    assert after.run is not None and after.run.stdout == "ok\n", after
