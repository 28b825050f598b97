"""A tenant's burst of new jails: their starts never run on the event loop's thread, are
bounded per node and per tenant, and one tenant's growth never holds another tenant's
call (issue 29). Structural checks: which thread a start's work runs on, how many starts
are in flight; never how long anything takes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from node.fncall.nsjail import NsjailBackend
from node.fncall.nsjail.jail import Jail
from node.fncall.nsjail.jailcgroup import CPU_SHARES, START_CPU_SHARES, V1JailCgroup
from node.fncall.nsjail.workers import JailWorkers, parse_key

pytestmark = [pytest.mark.nsjail, pytest.mark.asyncio(loop_scope="module")]

RunFn = Callable[..., Coroutine[Any, Any, Any]]
CGROUP_ROOT = "/sys/fs/cgroup"
V1 = Path(CGROUP_ROOT, "memory").is_dir()


async def test_jail_starts_and_stops_run_off_the_event_loop(
    run: RunFn, python_only: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fork/exec of nsjail and the jail's cgroup directories (made and removed) happen on
    other threads than the loop's: recorded for a new tenant's jails and their stop."""
    rt: NsjailBackend = await python_only(warm_per_language=1, idle_timeout_s=0.2)
    loop_thread = threading.get_ident()
    seen: list[tuple[str, int]] = []

    class RecordedPopen(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, args: Any, *rest: Any, **kw: Any) -> None:
            if any("nsjail" in str(arg) for arg in args):  # nsjail, or its cgroup wrapper
                seen.append(("exec", threading.get_ident()))
            super().__init__(args, *rest, **kw)

    def recorded(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(path: Any, *args: Any, **kw: Any) -> Any:
            if str(path).startswith(CGROUP_ROOT):
                seen.append((name, threading.get_ident()))
            return real(path, *args, **kw)

        return call

    monkeypatch.setattr(subprocess, "Popen", RecordedPopen)
    monkeypatch.setattr(os, "mkdir", recorded("mkdir", os.mkdir))
    monkeypatch.setattr(os, "rmdir", recorded("rmdir", os.rmdir))
    results = await asyncio.gather(
        *(run(rt, "print(1)", tenant="fresh") for _ in range(6)),
    )
    assert all(result.run.ok for result in results), results
    assert rt.pool is not None
    await rt.close()  # stops every jail: their groups are removed
    kinds = {kind for kind, _ in seen}
    assert "exec" in kinds  # not vacuous: new jails were started and recorded
    if rt.config.cgroups != "off" and V1:  # v1: the host makes and removes the groups
        assert {"mkdir", "rmdir"} <= kinds
    on_loop = [kind for kind, thread in seen if thread == loop_thread]
    assert on_loop == []


async def test_a_tenants_blocked_starts_do_not_hold_another_tenants_call(
    run: RunFn, python_only: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tenant A's burst needs new jails and every start of them hangs: B's call still
    gets a jail and runs before any of A's starts has ended, and A's starts in flight
    stay within the bounds."""
    rt: NsjailBackend = await python_only(
        warm_per_language=1, max_jails=12, start_timeout_s=60, acquire_timeout_s=90
    )
    gate = asyncio.Event()
    a_start_ended = asyncio.Event()
    in_flight: dict[str, int] = {}
    most: dict[str, int] = {}
    original = JailWorkers.start

    async def start(self: JailWorkers, key: str) -> Jail:
        tenant = parse_key(key)[1] or "spare"
        in_flight[tenant] = in_flight.get(tenant, 0) + 1
        most[tenant] = max(most.get(tenant, 0), in_flight[tenant])
        try:
            if tenant == "tenant-a":
                await gate.wait()
            return await original(self, key)
        finally:
            in_flight[tenant] -= 1
            if tenant == "tenant-a":
                a_start_ended.set()

    monkeypatch.setattr(JailWorkers, "start", start)
    # each call holds its jail a while, so the burst needs new jails, not released ones
    code = "import time\ntime.sleep(1)\nprint('a')\n"
    burst = [asyncio.create_task(run(rt, code, tenant="tenant-a")) for _ in range(40)]
    for _ in range(250):
        await asyncio.sleep(0.02)
        if in_flight.get("tenant-a"):
            break
    assert in_flight.get("tenant-a"), "tenant A's jail starts never began"

    other = asyncio.create_task(run(rt, "print('b')", tenant="tenant-b"))
    ended = asyncio.create_task(a_start_ended.wait())
    await asyncio.wait({other, ended}, return_when=asyncio.FIRST_COMPLETED)
    ended.cancel()
    assert other.done() and not a_start_ended.is_set()  # B did not wait for A's starts
    assert not all(task.done() for task in burst)  # ... nor for A's burst to end
    result = other.result()
    assert result.error is None, result.error
    assert result.run.ok and result.run.stdout == "b\n"

    per_key = rt.config.resolved_max_starts_per_key
    assert most["tenant-a"] <= per_key
    assert sum(in_flight.values()) <= rt.config.resolved_max_starts
    gate.set()
    results = await asyncio.gather(*burst)
    assert all(result.run.ok and result.run.stdout == "a\n" for result in results), results
    assert most["tenant-a"] <= per_key


@pytest.mark.skipif(not V1, reason="the host sets a start's weight on v1 groups it makes")
async def test_a_start_outweighs_running_jails_and_no_call_runs_at_its_weight(
    run: RunFn, python_only: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A jail starts at ``START_CPU_SHARES`` (the scheduler shares a core between the jails'
    groups by weight: a start at equal weight beside jails spinning user code crawls), and
    is back at ``CPU_SHARES`` before its first call: read from the kernel's files at the
    zygote's greeting and at the start of every call."""
    rt: NsjailBackend = await python_only(warm_per_language=0)
    if rt.config.cgroups == "off" or not rt.config.cpu_ms_per_sec:
        pytest.skip("jails without cpu groups")
    at_greeting: list[int] = []
    at_call: list[int] = []
    attach, call = Jail._attach_zygote, Jail.call

    def shares(jail: Jail) -> int:
        assert isinstance(jail.cgroup, V1JailCgroup) and jail.cgroup.cpu is not None
        return int((jail.cgroup.cpu / "cpu.shares").read_text())

    def attach_zygote(self: Jail) -> None:
        at_greeting.append(shares(self))
        attach(self)

    async def recorded_call(self: Jail, *args: Any, **kw: Any) -> Any:
        at_call.append(shares(self))
        return await call(self, *args, **kw)

    monkeypatch.setattr(Jail, "_attach_zygote", attach_zygote)
    monkeypatch.setattr(Jail, "call", recorded_call)
    results = await asyncio.gather(*(run(rt, "print(1)", tenant="weighed") for _ in range(3)))
    assert all(result.run.ok for result in results), results
    assert at_greeting and set(at_greeting) == {START_CPU_SHARES}
    assert len(at_call) == 3 and set(at_call) == {CPU_SHARES}
