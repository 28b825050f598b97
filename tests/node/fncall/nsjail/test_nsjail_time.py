"""CPU time from the jail's cgroup, and judging time fairly: contention, CPU-time limits,
compile memory. Real jails; the CPU figures compared here are CPU time the programs
measure themselves (``time.process_time``), so the assertions hold however loaded the
machine is."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
import pytest_asyncio

from node.fncall.nsjail import NsjailBackend, NsjailConfig
from node.fncall.nsjail.cgroups import CgroupMode, detect
from wire.execution import StageStatus

pytestmark = [pytest.mark.nsjail, pytest.mark.asyncio(loop_scope="module")]

RunFn = Callable[..., Coroutine[Any, Any, Any]]

#: workers that each burn ``cpu`` seconds of their own CPU time, say so on a pipe and exit
#: without being waited for: their CPU time is nowhere in the main process's rusage
UNWAITED_BURNERS = """
import os, time
r, w = os.pipe()
for _ in range({workers}):
    if os.fork() == 0:
        while time.process_time() < {cpu}:
            pass
        os.write(w, b'x')
        os._exit(0)
got = 0
while got < {workers}:
    got += len(os.read(r, 16))
print('done')
"""

BUSY = "while True:\n    pass\n"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def python_rt(new_runtime: Callable[..., NsjailBackend]) -> AsyncIterator[NsjailBackend]:
    # The jails of this module live under a cgroup parent of their own with 8x the
    # default CPU weight: jails compete for the CPU as cgroups (niceness only counts
    # within a group), so this keeps other work on a shared test machine, other test
    # runs' jails under CORRAL included, from deciding whether a jail alone gets its core.
    # The starved test starves its target with jails of the same parent.
    parent = f"CORRAL-TEST-{os.getpid()}"
    setup = detect(NsjailConfig(cgroup_parent=parent))
    rt = new_runtime(languages=["python", "cpp"], max_jails=16, cgroup_parent=parent)
    await rt.start()
    try:
        if setup.mode is CgroupMode.V1 and setup.cpu is not None:
            (setup.cpu / parent / "cpu.shares").write_text("8192")
        yield rt
    finally:
        await rt.close()
        for mount in (setup.memory, setup.pids, setup.cpu, setup.cpuacct):
            if mount is not None:
                with contextlib.suppress(OSError):
                    (mount / parent).rmdir()


async def test_cpu_of_unwaited_descendants_is_charged(run: RunFn, python_rt: NsjailBackend) -> None:
    code = UNWAITED_BURNERS.format(workers=2, cpu=1.0)
    result = await run(python_rt, code, run_timeout_s=60.0)
    assert result.run.ok, result.run
    # two workers used one CPU-second each; the rusage of the main process alone said ~10 ms
    assert 2000 <= result.run.cpu_ms < 3000, result.run.cpu_ms
    assert result.cpu_ms == result.run.cpu_ms


async def test_a_starved_stage_is_flagged_contended(run: RunFn, python_rt: NsjailBackend) -> None:
    burners = [f"burner-{i}" for i in range(6)]
    # warm one jail per burner tenant and for the target, so all start at once below
    warm = await asyncio.gather(*(run(python_rt, "pass", tenant=t) for t in [*burners, "starved"]))
    assert all(r.run.ok for r in warm), warm
    burning = [
        asyncio.create_task(run(python_rt, BUSY, tenant=t, run_timeout_s=6.0)) for t in burners
    ]
    await asyncio.sleep(1.0)
    starved = await run(python_rt, BUSY, tenant="starved", run_timeout_s=1.0)
    for result in await asyncio.gather(*burning):
        assert result.run.status is StageStatus.TIME_LIMIT
    # seven busy jails on this node's cores: the target got well under half a core
    assert starved.run.status is StageStatus.TIME_LIMIT, starved.run
    assert starved.run.contended is True, starved.run
    assert starved.run.cpu_ms < 0.5 * starved.run.wall_ms
    # it was ready to run and waiting for a core, not sleeping
    assert starved.run.wait_ms is not None and starved.run.wait_ms >= 0.25 * starved.run.wall_ms
    assert starved.contended is True


async def test_a_sleeper_past_its_wall_limit_is_not_contended(
    run: RunFn, python_rt: NsjailBackend
) -> None:
    # it used almost no CPU, as a starved stage does, but it never waited for a core
    code = "import time\ntime.sleep(30)\n"
    result = await run(python_rt, code, tenant="sleeper", run_timeout_s=1.0)
    assert result.run.status is StageStatus.TIME_LIMIT, result.run
    assert result.run.cpu_ms < 0.5 * result.run.wall_ms
    assert result.run.wait_ms is not None and result.run.wait_ms < 0.25 * result.run.wall_ms
    assert result.run.contended is False, result.run


async def test_a_busy_loop_alone_is_not_contended(run: RunFn, python_rt: NsjailBackend) -> None:
    result = await run(python_rt, BUSY, tenant="alone", run_timeout_s=1.0)
    assert result.run.status is StageStatus.TIME_LIMIT, result.run
    assert result.run.contended is False, result.run
    assert result.run.cpu_ms >= 0.5 * result.run.wall_ms


async def test_cpu_time_basis_lets_a_sleeper_finish(run: RunFn, python_rt: NsjailBackend) -> None:
    code = "import time\ntime.sleep(2)\nprint('slept')\n"
    result = await run(python_rt, code, run_timeout_s=1.0, time_basis="cpu")
    assert result.run.ok, result.run
    assert result.run.stdout == "slept\n"
    # the same with the default basis is stopped by the wall clock
    result = await run(python_rt, code, run_timeout_s=1.0)
    assert result.run.status is StageStatus.TIME_LIMIT


async def test_cpu_time_basis_stops_a_cpu_overrun(run: RunFn, python_rt: NsjailBackend) -> None:
    code = "import time\nwhile time.process_time() < 1.5:\n    pass\nprint('done')\n"
    result = await run(
        python_rt, code, run_timeout_s=1.0, time_basis="cpu", wall_backstop_factor=10.0
    )
    assert result.run.status is StageStatus.TIME_LIMIT, result.run
    assert "CPU-time limit of 1s" in (result.run.message or ""), result.run.message
    assert result.run.contended is False
    assert result.run.cpu_ms >= 1000


async def test_cpu_time_basis_counts_every_process(run: RunFn, python_rt: NsjailBackend) -> None:
    # two processes of 0.75 CPU-seconds each: neither meets a per-process limit, together
    # they overrun the stage's 1 s
    code = UNWAITED_BURNERS.format(workers=2, cpu=0.75)
    result = await run(
        python_rt, code, run_timeout_s=1.0, time_basis="cpu", wall_backstop_factor=10.0
    )
    assert result.run.status is StageStatus.TIME_LIMIT, result.run
    assert "CPU-time limit" in (result.run.message or ""), result.run.message
    assert result.run.contended is False


async def test_cpu_time_basis_keeps_a_wall_clock_backstop(
    run: RunFn, python_rt: NsjailBackend
) -> None:
    code = "import time\ntime.sleep(30)\n"
    result = await run(
        python_rt, code, run_timeout_s=1.0, time_basis="cpu", wall_backstop_factor=2.0
    )
    assert result.run.status is StageStatus.TIME_LIMIT, result.run
    assert "wall-clock limit of 2s" in (result.run.message or ""), result.run.message


async def test_compile_memory_comes_from_the_limits(run: RunFn, python_rt: NsjailBackend) -> None:
    hello = '#include <iostream>\nint main() { std::cout << "hi" << std::endl; }\n'
    result = await run(python_rt, hello, language="cpp", compile_memory_mb=64)
    # g++ needs more than 64 MiB of address space for <iostream>
    assert result.compile is not None and not result.compile.ok, result.compile
    assert result.run is None
    result = await run(python_rt, hello, language="cpp")
    assert result.compile.ok and result.run.ok
