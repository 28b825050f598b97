"""The node's sandbox manager: lifetimes, reaping, adoption after a restart."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from node.sandboxes.base import (
    RootImage,
    SandboxNotFound,
    SandboxNotRunning,
    SnapshotInUse,
    SnapshotNotFound,
)
from node.sandboxes.crun.backend import CrunBackend
from node.sandboxes.fake import FakeSandboxBackend
from node.sandboxes.manager import BROKEN, SandboxManager
from tests.node.sandboxes.conftest import leftovers, spec
from wire.sandboxes import ExecRequest, SandboxSpec, SandboxState

IMAGE = RootImage(digest="sha256:" + "f" * 64, rootfs=Path("/nonexistent"))


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def gone(pid: int) -> None:
    """Wait until ``pid`` has ended and been reaped."""
    while Path(f"/proc/{pid}").exists():
        time.sleep(0.01)


def manager(
    tmp_path: Path,
    backend: object,
    clock: Callable[[], float] = time.time,
    image: RootImage = IMAGE,
    **options: Any,
) -> SandboxManager:
    name = backend.name
    return SandboxManager(
        {name: backend},  # type: ignore[dict-item]
        lambda ref: image,
        state_dir=tmp_path / "records",
        clock=clock,
        **options,
    )


async def test_ttl_and_idle_timeout_reap(tmp_path: Path) -> None:
    clock, backend = Clock(), FakeSandboxBackend()
    m = manager(tmp_path, backend, clock)
    await m.start()
    try:
        await m.create(spec("s-ttl", backend="fake", ttl_s=60))
        await m.create(spec("s-idle", backend="fake", ttl_s=600, idle_timeout_s=30))
        clock.now += 20
        await m.exec("s-idle", ExecRequest(cmd=["echo"]))  # use keeps it alive
        clock.now += 25
        await m.reap()
        assert (await m.status("s-idle")).state is SandboxState.RUNNING
        clock.now += 20  # 65 s: past the TTL of s-ttl, 45 s idle for s-idle
        await m.reap()
        assert (await m.status("s-ttl")).reason == "expired"
        assert (await m.status("s-idle")).reason == "idle"
        assert backend.sandboxes == {}
        with pytest.raises(SandboxNotRunning):
            await m.exec("s-ttl", ExecRequest(cmd=["echo"]))
    finally:
        await m.close()


async def test_set_timeout_moves_the_end(tmp_path: Path) -> None:
    clock = Clock()
    m = manager(tmp_path, FakeSandboxBackend(), clock)
    await m.start()
    try:
        await m.create(spec("s-t", backend="fake", ttl_s=10))
        clock.now += 5
        await m.set_timeout("s-t", 100)
        clock.now += 50
        await m.reap()
        assert (await m.status("s-t")).state is SandboxState.RUNNING
    finally:
        await m.close()


async def test_a_restarted_manager_adopts_what_it_saved_and_destroys_the_rest(
    tmp_path: Path,
) -> None:
    clock, backend = Clock(), FakeSandboxBackend()
    first = manager(tmp_path, backend, clock)
    await first.start()
    await first.create(spec("s-keep", backend="fake"))
    await first.pause("s-keep")
    await first.close()
    backend.sandboxes["s-stray"] = backend.sandboxes["s-keep"]  # no saved record
    second = manager(tmp_path, backend, clock)
    await second.start()
    try:
        assert (await second.status("s-keep")).state is SandboxState.PAUSED
        assert "s-stray" not in backend.sandboxes
        with pytest.raises(SandboxNotFound):
            await second.status("s-stray")
    finally:
        await second.close()


@pytest.mark.crun
async def test_an_abandoned_container_is_reaped_at_its_ttl_and_freed(
    tmp_path: Path, busybox_image: RootImage
) -> None:
    clock = Clock()
    backend = CrunBackend(tmp_path / "data")
    m = manager(tmp_path, backend, clock, busybox_image)
    await m.start()
    try:
        await m.create(spec("sbx-abandoned", ttl_s=30))
        assert leftovers(tmp_path / "data", "sbx-abandoned")
        clock.now += 31
        await m.reap()
        assert (await m.status("sbx-abandoned")).reason == "expired"
        assert leftovers(tmp_path / "data", "sbx-abandoned") == []
    finally:
        await m.destroy_all("test over")
        await m.close()


@pytest.mark.crun
async def test_a_sandbox_whose_init_ended_is_destroyed_as_broken_and_freed(
    tmp_path: Path, busybox_image: RootImage
) -> None:
    """Its init killed (as the OOM killer does when a sandbox's memory is full and init is
    all that is left to kill): the sandbox can never run a command again, so the reaper
    destroys it, saying why, instead of leaving a record that answers errors."""
    clock = Clock()
    backend = CrunBackend(tmp_path / "data")
    m = manager(tmp_path, backend, clock, busybox_image)
    await m.start()
    try:
        await m.create(spec("sbx-broken", ttl_s=300))
        init = int((await backend._runtime_json("state", "sbx-broken"))["pid"])
        os.kill(init, signal.SIGKILL)
        await asyncio.to_thread(gone, init)
        await m.read_usage()
        await m.reap()
        status = await m.status("sbx-broken")
        assert (status.state, status.reason) == (SandboxState.STOPPED, BROKEN)
        assert leftovers(tmp_path / "data", "sbx-broken") == []
    finally:
        await m.destroy_all("test over")
        await m.close()


@pytest.mark.crun
async def test_snapshots_carry_files_and_deletions_across_a_chain(
    tmp_path: Path, busybox_image: RootImage
) -> None:
    from wire.sandboxes import collect

    async def sh(sandbox_id: str, line: str) -> str:
        process = await m.exec(sandbox_id, ExecRequest(cmd=["sh", "-c", line], user="root"))
        return (await collect(process.events())).stdout.decode()

    m = manager(tmp_path, CrunBackend(tmp_path / "data"), Clock(), busybox_image)
    await m.start()
    try:
        await m.create(spec("sbx-origin"))
        await sh("sbx-origin", "echo one > /home/user/a; rm /etc/secret; mkdir -p /opt/x")
        first = await m.snapshot("sbx-origin", "snap_one")
        assert first.size_bytes >= 4 and first.parent_snapshot_id is None
        await m.create(spec("sbx-second", snapshot_id="snap_one"))
        listing = await sh("sbx-second", "cat /home/user/a; ls /etc; ls -d /opt/x")
        assert "one" in listing and "secret" not in listing and "/opt/x" in listing
        await sh("sbx-second", "echo two > /home/user/b")
        second = await m.snapshot("sbx-second", "snap_two")
        assert second.parent_snapshot_id == "snap_one"
        await m.create(spec("sbx-third", snapshot_id="snap_two"))
        assert (await sh("sbx-third", "cat /home/user/a /home/user/b")) == "one\ntwo\n"
        assert "secret" not in await sh("sbx-third", "ls /etc")
        assert "secret" not in await sh("sbx-origin", "ls /etc")  # the origin goes on as it was
        assert (await m.status("sbx-origin")).state is SandboxState.RUNNING
        with pytest.raises(SnapshotInUse):
            await m.delete_snapshot("snap_one", tenant_id="ten_test")
        with pytest.raises(SnapshotNotFound):
            await m.delete_snapshot("snap_one", tenant_id="ten_other")
    finally:
        await m.destroy_all("test over")
        for sid in ("snap_two", "snap_one"):
            await m.delete_snapshot(sid, tenant_id="ten_test")
        await m.close()
    assert not (tmp_path / "data" / "sandboxes" / ".snapshots" / "snap_one").exists()


@pytest.mark.crun
async def test_a_create_claims_a_warm_paused_sandbox_with_its_own_limits(
    tmp_path: Path, busybox_image: RootImage
) -> None:
    import asyncio

    from tests.node.sandboxes.conftest import cgroup_file
    from wire.sandboxes import collect

    backend = CrunBackend(tmp_path / "data")
    m = SandboxManager(
        {"crun": backend},
        lambda ref: busybox_image,
        state_dir=tmp_path / "records",
        warm={"busybox": 2},
        max_warm=4,
    )
    await m.start()
    warm_ids: list[str] = []
    try:
        # a warm sandbox's directory appears when its create starts; it is in the pool
        # (and must be frozen) only once its pause has settled
        for _ in range(200):
            stats = m.pool_stats()
            if stats["warm"] >= 2 and stats["starting"] == 0:
                break
            await asyncio.sleep(0.05)
        assert m.pool_stats()["warm"] >= 2
        warm_ids = [p.name for p in (tmp_path / "data" / "sandboxes").glob("warm-*")]
        assert len(warm_ids) == m.pool_stats()["warm"]
        for warm_id in warm_ids:
            assert cgroup_file("freezer", warm_id, "freezer.state").strip() == "FROZEN"
        status = await m.create(spec("sbx-claimed", memory_mb=96, pids=48, env={"E": "1"}))
        assert status.state is SandboxState.RUNNING
        claimed = (tmp_path / "data" / "sandboxes" / "sbx-claimed").resolve().name
        assert claimed in warm_ids  # it is one of the warm ones
        assert cgroup_file("memory", claimed, "memory.limit_in_bytes").strip() == str(96 << 20)
        assert cgroup_file("pids", claimed, "pids.max").strip() == "48"
        process = await m.exec("sbx-claimed", ExecRequest(cmd=["sh", "-c", "id -u; echo $E"]))
        assert (await collect(process.events())).stdout.decode().split() == ["1000", "1"]
        await m.destroy("sbx-claimed")
        assert not (tmp_path / "data" / "sandboxes" / "sbx-claimed").exists()
        assert leftovers(tmp_path / "data", claimed) == []
    finally:
        await m.destroy_all("test over")
        await m.close()
    left = [p.name for p in (tmp_path / "data" / "sandboxes").glob("warm-*")]
    assert left == [], "close left warm sandboxes"


async def test_a_create_its_backend_cannot_claim_a_warm_sandbox_as_is_made_cold(
    tmp_path: Path,
) -> None:
    """A backend whose warm sandboxes keep their size (a microVM's memory, vCPUs, disk)
    claims one only for a create of the warm shape; any other create is made cold and the
    warm one stays in the pool."""
    from node.sandboxes.warm import WARM_DISK_MB, WARM_MEMORY_MB

    class SizedBackend(FakeSandboxBackend):
        def claimable(self, warm: SandboxSpec, spec: SandboxSpec) -> bool:
            return (warm.memory_mb, warm.disk_mb) == (spec.memory_mb, spec.disk_mb)

    backend = SizedBackend()
    m = manager(tmp_path, backend, warm={"busybox": 1}, max_warm=2)
    await m.start()
    try:
        warm_ids = {i for i in backend.sandboxes if i.startswith("warm-")}
        assert len(warm_ids) == 1
        await m.create(spec("sbx-small", backend="fake", memory_mb=128, disk_mb=32))
        assert warm_ids <= set(backend.sandboxes)  # not claimed: made cold
        assert backend.sandboxes["sbx-small"].spec.memory_mb == 128
        await m.create(
            spec("sbx-warm", backend="fake", memory_mb=WARM_MEMORY_MB, disk_mb=WARM_DISK_MB)
        )
        assert not warm_ids & set(backend.sandboxes)  # the warm one became sbx-warm
    finally:
        await m.destroy_all("test over")
        await m.close()


async def test_a_burst_beyond_capacity_waits_in_a_bounded_queue_then_fails_clearly(
    tmp_path: Path,
) -> None:
    import asyncio

    from node.sandboxes.base import NodeFull
    from node.sandboxes.manager import CreateLimits

    backend = FakeSandboxBackend()
    backend.create_delay_s = 0.3
    m = SandboxManager(
        {"fake": backend},
        lambda ref: IMAGE,
        state_dir=tmp_path / "records",
        limits=CreateLimits(max_sandboxes=3, concurrency=1, queue=1, wait_s=0.45),
    )
    await m.start()
    try:
        started = asyncio.get_running_loop().time()
        outcomes = await asyncio.gather(
            *(m.create(spec(f"s-{i}", backend="fake")) for i in range(4)), return_exceptions=True
        )
        took = asyncio.get_running_loop().time() - started
        made = [o for o in outcomes if not isinstance(o, BaseException)]
        refused = [o for o in outcomes if isinstance(o, NodeFull)]
        # one runs, one waits its turn (0.3 s < 0.45 s), the rest find the queue full
        assert len(made) == 2 and len(refused) == 2, outcomes
        assert any("wait" in str(r) for r in refused)
        assert took < 2.0  # nothing hangs
        await m.create(spec("s-5", backend="fake"))
        with pytest.raises(NodeFull, match="most sandboxes"):
            await m.create(spec("s-6", backend="fake"))
        assert m.room() == 0
    finally:
        await m.close()


async def test_creates_past_the_memory_and_cpu_the_node_gives_sandboxes_are_refused(
    tmp_path: Path,
) -> None:
    """Two gateways may place on one node at once: the node itself keeps the sum of its
    sandboxes' limits within its budget, whatever the order creates arrive in."""
    import asyncio

    from node.sandboxes.base import NodeFull
    from node.sandboxes.manager import CreateLimits

    backend = FakeSandboxBackend()
    backend.create_delay_s = 0.05  # creates overlap
    m = SandboxManager(
        {"fake": backend},
        lambda ref: IMAGE,
        state_dir=tmp_path / "records",
        limits=CreateLimits(memory_mb=1024, cpu=3.0),
    )
    await m.start()
    try:
        outcomes = await asyncio.gather(
            *(m.create(spec(f"s-{i}", backend="fake", memory_mb=512)) for i in range(5)),
            return_exceptions=True,
        )
        made = [o for o in outcomes if not isinstance(o, BaseException)]
        refused = [o for o in outcomes if isinstance(o, NodeFull)]
        assert len(made) == 2 and len(refused) == 3, outcomes
        assert "no room for 512 MiB" in str(refused[0])
        assert m.held() == (1024, 2.0)
        capacity = m.capacity()
        assert (capacity.memory_mb, capacity.memory_free_mb) == (1024, 0)
        assert (capacity.cpu, capacity.cpu_free) == (3.0, 1.0)
        await m.destroy(made[0].sandbox_id)
        with pytest.raises(NodeFull, match="CPU"):
            await m.create(spec("s-cpu", backend="fake", memory_mb=64, cpu=2.5))
        assert m.capacity().memory_free_mb == 512  # a refused create holds nothing
        await m.create(spec("s-again", backend="fake", memory_mb=512))
        assert m.capacity().memory_free_mb == 0
    finally:
        await m.destroy_all("test over")
        await m.close()


async def test_a_destroy_reads_the_cpu_its_sandbox_used_last(tmp_path: Path) -> None:
    """The CPU a sandbox burnt reaches its tenant's quota even if nobody read its status
    before it ended (the inventory carries the reaper's readings meanwhile)."""
    m = manager(tmp_path, FakeSandboxBackend(), Clock())
    await m.start()
    try:
        await m.create(spec("s-read", backend="fake"))
        assert [s.cpu_ms for s in m.inventory()] == [None]
        await m.read_usage()  # what the reaper does every USAGE_EVERY_S
        assert [s.cpu_ms for s in m.inventory()] == [1.0]
        await m.create(spec("s-unread", backend="fake"))
        ended = await m.destroy("s-unread")
        assert ended.state is SandboxState.STOPPED and ended.cpu_ms == 1.0
    finally:
        await m.destroy_all("test over")
        await m.close()


async def test_creates_of_one_image_share_one_resolve(tmp_path: Path) -> None:
    """A missing image is fetched once however many creates want it at once."""
    import asyncio
    import threading

    calls: list[str] = []
    release = threading.Event()
    asked = asyncio.Event()
    loop = asyncio.get_running_loop()

    def slow_resolve(ref: str) -> RootImage:
        calls.append(ref)
        loop.call_soon_threadsafe(asked.set)
        release.wait(10)  # held until every create has asked
        return IMAGE

    m = SandboxManager({"fake": FakeSandboxBackend()}, slow_resolve, state_dir=tmp_path / "records")
    await m.start()
    try:
        creates = [
            asyncio.create_task(m.create(spec(f"s-{i}", backend="fake", image=IMAGE.digest)))
            for i in range(3)
        ]
        await asyncio.wait_for(asked.wait(), 10)
        for _ in range(100):  # the other creates reach the resolve (no I/O on their way)
            await asyncio.sleep(0)
        release.set()
        statuses = await asyncio.gather(*creates)
        assert calls == [IMAGE.digest]
        assert {s.image_digest for s in statuses} == {IMAGE.digest}
    finally:
        await m.close()


async def test_a_second_node_on_the_same_data_dir_is_refused_not_let_destroy(
    tmp_path: Path,
) -> None:
    """A second manager on the state dir would take the first's sandboxes for orphans
    and destroy them: it is refused while the first holds the dir, and starts (adopting
    them) once the first has gone."""
    from node.sandboxes.base import BackendUnavailable

    clock, backend = Clock(), FakeSandboxBackend()
    first = manager(tmp_path, backend, clock)
    await first.start()
    await first.create(spec("s-kept", backend="fake"))
    second = manager(tmp_path, backend, clock)
    with pytest.raises(BackendUnavailable, match="another node holds"):
        await second.start()
    assert (await first.status("s-kept")).state is SandboxState.RUNNING
    await first.close()
    third = manager(tmp_path, backend, clock)
    await third.start()
    try:
        assert (await third.status("s-kept")).state is SandboxState.RUNNING
    finally:
        await third.destroy_all("test over")
        await third.close()
