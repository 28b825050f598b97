"""The warm pool: tenant isolation, binding of spare jails, recycling, reaping, bounds,
and a clean close()."""

from __future__ import annotations

import asyncio
import os
import pathlib
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from node.fncall.nsjail import NsjailBackend, NsjailConfig, cgroups
from wire.messages import pool_key

pytestmark = [pytest.mark.nsjail, pytest.mark.asyncio(loop_scope="module")]

RunFn = Callable[..., Coroutine[Any, Any, Any]]
WHOAMI = "import socket\nprint(socket.gethostname())\n"


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rsplit(b")", 1)[1].split()[0] != b"Z"


def nsjail_children() -> list[int]:
    """nsjail processes whose parent is this test process."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = pathlib.Path(f"/proc/{name}/stat").read_bytes()
            cmd = pathlib.Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(b")", 1)[1].split()[1])
        if ppid == os.getpid() and b"nsjail" in cmd.split(b"\0")[0]:
            found.append(int(name))
    return found


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_tenants_never_share_a_jail(run: RunFn, python_only: Any) -> None:
    rt: NsjailBackend = await python_only(warm_per_language=1)
    write = "import socket\nopen('/tmp/secret-a', 'w').write('a')\nprint(socket.gethostname())\n"
    a1 = await run(rt, write, tenant="tenant-a")
    b1 = await run(
        rt,
        "import os, socket\nprint(os.path.exists('/tmp/secret-a'))\nprint(socket.gethostname())\n",
        tenant="tenant-b",
    )
    a2 = await run(rt, WHOAMI, tenant="tenant-a")
    assert a1.run.ok and b1.run.ok and a2.run.ok
    host_a = a1.run.stdout.strip()
    exists_b, host_b = b1.run.stdout.split()
    assert exists_b == "False"
    assert host_a != host_b
    assert a2.run.stdout.strip() == host_a  # tenant A is served by its own warm jail again

    # many concurrent calls of two tenants: the jails they see never overlap
    calls = [run(rt, WHOAMI, tenant=f"tenant-{t}") for t in "ab" * 6]
    results = await asyncio.gather(*calls)
    seen: dict[str, set[str]] = {"tenant-a": set(), "tenant-b": set()}
    for tenant, result in zip([f"tenant-{t}" for t in "ab" * 6], results, strict=True):
        assert result.run.ok, result
        seen[tenant].add(result.run.stdout.strip())
    assert seen["tenant-a"].isdisjoint(seen["tenant-b"])
    seen["tenant-a"].add(host_a)
    seen["tenant-b"].add(host_b)
    assert rt.pool is not None
    for jail in rt.pool.workers():
        # a jail that served calls served its own tenant's only; one started for a tenant
        # while a released jail served its waiter may not have served anybody yet
        others = set().union(*(hosts for t, hosts in seen.items() if t != jail.tenant))
        assert jail.hostname not in others
        if jail.tenant is not None and jail.uses:
            assert jail.hostname in seen[jail.tenant]


async def test_new_tenant_gets_a_warm_spare(run: RunFn, python_only: Any) -> None:
    rt: NsjailBackend = await python_only(warm_per_language=1)
    assert rt.pool is not None
    assert rt.stats() == {"warm": 1, "busy": 0, "starting": 0}
    [spare] = rt.pool.workers()
    assert spare.tenant is None
    result = await run(rt, WHOAMI, tenant="fresh-tenant")
    assert result.run.ok
    assert result.run.stdout.strip() == spare.hostname  # the spare was bound, not started
    assert spare.tenant == "fresh-tenant"
    assert result.setup_ms < 50
    # a replacement spare is started in the background
    await wait_for(lambda: rt.stats()["warm"] == 2)
    spares = [jail for jail in rt.pool.workers() if jail.tenant is None]
    assert len(spares) == 1 and spares[0] is not spare


async def test_busy_gauge(run: RunFn, python_only: Any) -> None:
    rt: NsjailBackend = await python_only()
    task = asyncio.create_task(run(rt, "import time\ntime.sleep(0.5)\n", tenant="t"))
    await wait_for(lambda: rt.stats()["busy"] == 1)
    assert (await task).run.ok
    assert rt.stats()["busy"] == 0


async def test_jail_is_recycled_after_max_uses(run: RunFn, python_only: Any) -> None:
    rt: NsjailBackend = await python_only(max_uses_per_jail=3)
    assert rt.pool is not None
    hosts = []
    for _ in range(3):
        result = await run(rt, WHOAMI, tenant="t")
        assert result.run.ok
        hosts.append(result.run.stdout.strip())
    assert len(set(hosts)) == 1
    # the third use retired the jail already
    assert hosts[0] not in {jail.hostname for jail in rt.pool.workers()}
    result = await run(rt, WHOAMI, tenant="t")
    assert result.run.ok
    assert result.run.stdout.strip() != hosts[0]


async def test_idle_jails_are_reaped(run: RunFn, python_only: Any) -> None:
    rt: NsjailBackend = await python_only(idle_timeout_s=0.3, reap_interval_s=0.1)
    assert rt.pool is not None
    result = await run(rt, WHOAMI, tenant="sleepy")
    assert result.run.ok
    [jail] = [jail for jail in rt.pool.workers() if jail.tenant == "sleepy"]
    pids = [jail.pid, jail.zygote_pid]
    await wait_for(lambda: jail not in rt.pool.workers())  # type: ignore[union-attr]
    await wait_for(lambda: not any(alive(pid) for pid in pids if pid))


async def test_total_jails_are_bounded(run: RunFn, python_only: Any) -> None:
    rt: NsjailBackend = await python_only(max_jails=2, warm_per_language=1)
    assert rt.pool is not None
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, len(rt.pool.workers()) + rt.stats()["starting"])  # type: ignore[union-attr]
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        results = await asyncio.gather(
            *(run(rt, "import time\ntime.sleep(0.3)\n", tenant=f"t{i}") for i in range(4))
        )
    finally:
        watcher.cancel()
    assert all(result.run.ok for result in results), results
    assert peak <= 2


async def test_close_kills_everything_and_is_idempotent(
    run: RunFn, new_runtime: Callable[..., NsjailBackend]
) -> None:
    before = set(nsjail_children())
    rt = new_runtime(languages=["python", "bash"], warm_per_language=2)
    await rt.start()
    assert rt.pool is not None
    for tenant in ("x", "y"):
        assert (await run(rt, WHOAMI, tenant=tenant)).run.ok
    busy = asyncio.create_task(run(rt, "import time\ntime.sleep(30)\n", tenant="z"))
    await wait_for(lambda: rt.stats()["busy"] == 1)
    jails = rt.pool.workers()
    assert len(jails) >= 5
    pids = [pid for jail in jails for pid in (jail.pid, jail.zygote_pid) if pid]
    cgroups = [
        pathlib.Path(f"/sys/fs/cgroup/{c}/CORRAL/{jail.id}")
        for jail in jails
        for c in ("memory", "pids", "cpu", "cpuacct")
    ]
    assert all(path.exists() for path in cgroups)
    etc_dir = rt.shared_dir
    assert etc_dir is not None and etc_dir.exists()

    await rt.close()
    result = await busy
    assert result.error is not None  # the in-flight call failed cleanly, it did not hang
    assert not any(alive(pid) for pid in pids)
    assert set(nsjail_children()) <= before
    assert not any(path.exists() for path in cgroups)
    assert not etc_dir.exists()
    assert rt.stats() == {"warm": 0, "busy": 0, "starting": 0}
    await rt.close()  # idempotent
    after = await run(rt, WHOAMI)
    assert after.error is not None and "not running" in after.error


async def test_close_kills_jails_being_started(
    run: RunFn, new_runtime: Callable[..., NsjailBackend]
) -> None:
    before = set(nsjail_children())
    rt = new_runtime(languages=["python"], warm_per_language=0)
    await rt.start()
    assert rt.stats() == {"warm": 0, "busy": 0, "starting": 0}
    call = asyncio.create_task(run(rt, WHOAMI, tenant="late"))
    await wait_for(lambda: rt.stats()["starting"] == 1)  # a cold start for the caller
    await rt.close()
    result = await call
    assert result.error is not None and result.run is None
    assert set(nsjail_children()) <= before


async def test_close_after_failed_start(new_runtime: Callable[..., NsjailBackend]) -> None:
    rt = new_runtime(languages=["python"], nsjail_path="/nonexistent/nsjail")
    with pytest.raises(RuntimeError, match="nsjail"):
        await rt.start()
    await rt.close()
    await rt.close()


async def test_inventory_and_idle_capacity_by_pool_key(run: RunFn, python_only: Any) -> None:
    rt: NsjailBackend = await python_only(warm_per_language=1)
    spare_key, bound_key = pool_key("nsjail", "python"), pool_key("nsjail", "python", "inv-t")
    assert rt.inventory() == {spare_key: 1}
    assert (await run(rt, WHOAMI, tenant="inv-t")).run.ok
    await wait_for(lambda: rt.inventory() == {spare_key: 1, bound_key: 1})
    await asyncio.sleep(0.05)  # both keys hold an idle jail meanwhile
    capacity = rt.idle_capacity()
    assert set(capacity) == {spare_key, bound_key}
    spare, bound = capacity[spare_key], capacity[bound_key]
    assert spare.instance_seconds > 0 and spare.memory_mb_seconds > 0
    assert (spare.starts, spare.cold_starts) == (2, 0)  # the first spare and its replacement
    # starting a jail costs CPU (nsjail's set-up, PID 1's Python), read from its cgroup
    assert spare.start_cpu_ms > 1.0
    assert bound.instance_seconds > 0 and bound.memory_mb_seconds > 0
    assert bound.starts == 0  # it adopted the spare
    # a warm jail holds at least a megabyte (its zygote)
    assert bound.memory_mb_seconds >= bound.instance_seconds
    again = rt.idle_capacity()  # accrued since the previous call only
    assert again[spare_key].instance_seconds < spare.instance_seconds
    assert again[spare_key].starts == 0


async def test_a_tenant_id_is_required(run: RunFn, python_only: Any) -> None:
    rt: NsjailBackend = await python_only()
    result = await run(rt, WHOAMI, tenant="")
    assert result.error is not None and "tenant" in result.error
    assert rt.stats()["busy"] == 0 and rt.inventory() == {pool_key("nsjail", "python"): 1}


async def test_groups_left_by_a_dead_node_are_swept(monkeypatch: pytest.MonkeyPatch) -> None:
    # a node killed with its jails leaves their (empty) v1 groups; the next start removes
    # those older than SWEEP_AFTER_S, never a younger one (another runtime may be
    # starting that jail right now)
    setup = cgroups.detect(NsjailConfig(cgroup_parent=f"CORRAL-SWEEP-{os.getpid()}"))
    if setup.mode is not cgroups.CgroupMode.V1 or setup.memory is None:
        pytest.skip("needs cgroup v1 memory")
    parent = setup.memory / setup.parent
    parent.mkdir()
    try:
        left, other = parent / "0123456789ab", parent / "not-a-jail"
        left.mkdir()
        other.mkdir()
        cgroups.sweep(parent)
        assert left.exists()  # too young
        monkeypatch.setattr(cgroups, "SWEEP_AFTER_S", 0.0)
        cgroups.sweep(parent)
        assert not left.exists() and other.exists()
        other.rmdir()
    finally:
        parent.rmdir()
