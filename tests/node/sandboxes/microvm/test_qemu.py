"""Real microVMs under QEMU (TCG here; KVM where it works), with the stand-in agent of
conftest.py: cold boot, the overlay disk, template save and clone restore, pause and
resume, kill, leftovers after a node crash, a guest panic. Times are printed, not judged.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path

import pytest

from node.sandboxes.base import SandboxNotRunning, Unsupported
from node.sandboxes.microvm import qemu
from node.sandboxes.microvm.qemu import Template, Vm, VmConfig
from tests.node.sandboxes.microvm.conftest import (
    CGROUP_PARENT,
    MIB,
    MINE,
    Agent,
    VmEnv,
    leftover_cgroups,
    qemu_pids,
)

pytestmark = [pytest.mark.microvm, pytest.mark.usefixtures("no_vm_leaks")]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def proc_status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


async def test_cold_boot_reaches_the_agent_with_the_disk_writable_through_the_overlay(
    vm_env: VmEnv,
) -> None:
    base_before = digest(vm_env.base)
    started = time.monotonic()
    vm = await Vm.boot(
        vm_env.run_root, vm_env.new_id(), vm_env.config, disk_base=vm_env.base,
        disk_size=160 * MIB,
    )  # fmt: skip
    try:
        agent, _ = await Agent.connect(vm)
        print(f"cold boot to the agent: {time.monotonic() - started:.2f} s")
        try:
            assert await agent.ask("pid") == "1"
            # the file system was grown online to the overlay's size (160 MiB)
            assert int(await agent.ask("size")) > 120 * 1024
            # owners and modes of the image survive mkfs.ext4 -d
            assert await agent.ask("owner") == "1000:1000:755"
            assert await agent.ask("read") == "none"
            assert await agent.ask("write hello-disk") == "ok"
            assert await agent.ask("read") == "hello-disk"
        finally:
            agent.close()
        # QEMU runs as the VM user, in its own cgroups, with the memory limit set
        status = proc_status(vm.pid)
        uid = str(os.stat(vm.run_dir).st_uid)
        assert status["Uid"].split()[:2] == [uid, uid] and uid != "0"
        assert status["CapEff"] == "0000000000000000"
        cgroup = await asyncio.to_thread(Path(f"/proc/{vm.pid}/cgroup").read_text)
        assert f"/{CGROUP_PARENT}/{vm.id}" in cgroup
        limit = qemu.CGROUP_ROOT / "memory" / CGROUP_PARENT / vm.id / "memory.limit_in_bytes"
        assert int(limit.read_text()) == (192 + 160) * MIB
        assert vm.disk.exists()
    finally:
        ended = await vm.kill()
    assert ended.returncode is not None
    assert not vm.run_dir.exists()
    assert qemu_pids(str(vm.run_dir)) == []
    assert digest(vm_env.base) == base_before


async def test_clones_restore_from_the_template_each_with_its_own_disk(
    vm_env: VmEnv, template: Template
) -> None:
    clones: list[Vm] = []
    try:
        for _ in range(2):
            started = time.monotonic()
            vm = await Vm.restore(vm_env.run_root, vm_env.new_id("clone"), template)
            clones.append(vm)
            agent, _ = await Agent.connect(vm)
            print(f"restore to the agent's first answer: {time.monotonic() - started:.3f} s")
            try:
                assert await agent.ask("read") == "template-data"
                assert await agent.ask(f"write {vm.id}") == "ok"
                assert await agent.ask("read") == vm.id
                assert await agent.ask("pid") == "1"
            finally:
                agent.close()
        # the template's own disk is untouched by its clones
        assert oct(template.disk.stat().st_mode & 0o777) == "0o444"
    finally:
        for vm in clones:
            await vm.kill()


async def test_a_clone_with_a_larger_disk_grows_its_file_system(
    vm_env: VmEnv, template: Template
) -> None:
    vm = await Vm.restore(vm_env.run_root, vm_env.new_id("grow"), template, disk_size=200 * MIB)
    try:
        agent, _ = await Agent.connect(vm)
        try:
            before = int(await agent.ask("size"))
            assert before < 100 * 1024  # the template's 96 MiB
            assert await agent.ask("grow", timeout=60) == "ok"
            assert int(await agent.ask("size")) > 150 * 1024
            assert await agent.ask("read") == "template-data"
        finally:
            agent.close()
        with pytest.raises(Unsupported):
            await vm.resize_disk(100 * MIB)
    finally:
        await vm.kill()


async def test_pause_stops_the_guest_and_resume_lets_it_answer(
    vm_env: VmEnv, template: Template
) -> None:
    vm = await Vm.restore(vm_env.run_root, vm_env.new_id("pause"), template)
    try:
        agent, _ = await Agent.connect(vm)
        try:
            await vm.pause()
            assert await vm.status() == "paused"
            asked = asyncio.create_task(agent.ask("read", timeout=30))
            await asyncio.sleep(1.0)
            assert not asked.done()  # a paused guest runs nothing
            await vm.resume()
            assert await vm.status() == "running"
            assert await asked == "template-data"
        finally:
            agent.close()
    finally:
        await vm.kill()


async def test_kill_leaves_no_process_run_dir_or_cgroup(vm_env: VmEnv, template: Template) -> None:
    vm = await Vm.restore(vm_env.run_root, vm_env.new_id("kill"), template)
    pid = vm.pid
    assert qemu_pids(str(vm.run_dir)) == [pid]
    ended = await vm.kill()
    assert ended.returncode == -9
    assert vm.ended == ended
    assert qemu_pids(str(vm.run_dir)) == []
    assert not vm.run_dir.exists()
    assert leftover_cgroups(MINE) == []
    with pytest.raises(SandboxNotRunning):
        await vm.pause()
    assert await vm.kill() == ended  # again: nothing to do


async def test_leftovers_of_a_crashed_node_are_found_and_reaped(
    vm_env: VmEnv, template: Template
) -> None:
    vm = await Vm.restore(vm_env.run_root, vm_env.new_id("left"), template)
    try:
        # the node "crashes": it forgets the VM, which runs on
        assert vm.id in qemu.leftovers(vm_env.run_root)
        await asyncio.to_thread(qemu.reap, vm_env.run_root, vm.id, CGROUP_PARENT)
        assert qemu_pids(str(vm.run_dir)) == []
        assert not vm.run_dir.exists()
        assert vm.id not in qemu.leftovers(vm_env.run_root)
        assert leftover_cgroups(MINE) == []
        ended = await vm.wait()
        assert ended.returncode == -9
    finally:
        await vm.kill()


async def test_a_guest_kernel_panic_ends_qemu_and_is_reported(
    vm_env: VmEnv, template: Template
) -> None:
    vm = await Vm.restore(vm_env.run_root, vm_env.new_id("panic"), template)
    try:
        agent, _ = await Agent.connect(vm)
        try:
            agent.writer.write(b"x panic\n")
            await agent.writer.drain()
            async with asyncio.timeout(60):
                ended = await vm.wait()
        finally:
            agent.close()
        assert ended.returncode == 0
        assert ended.reason == "guest-reset"
        assert "Kernel panic" in vm.serial_tail()
    finally:
        await vm.kill()


async def test_a_broken_guest_says_why_on_its_console_and_ends(vm_env: VmEnv) -> None:
    # no root disk: the initramfs's init fails, prints it, and ends the machine
    vm = await Vm.boot(vm_env.run_root, vm_env.new_id("nodisk"), vm_env.config, disk_base=None)
    try:
        async with asyncio.timeout(60):
            ended = await vm.wait()
        assert ended.reason == "guest-reset"
        assert "corral-init: FATAL: no root disk" in vm.serial_tail()
    finally:
        await vm.kill()
    assert "corral-init: FATAL" in vm.last_serial


async def test_the_probe_boot_reaches_its_init_and_the_accelerator_can_be_forced(
    vm_env: VmEnv,
) -> None:
    # the probe's mechanics under TCG (the node probes KVM the same way)
    assert await qemu.probe_kvm(vm_env.artifacts, vm_env.run_root, accel="tcg", timeout=60)
    assert await qemu.accelerator(vm_env.artifacts, vm_env.run_root, "tcg") == "tcg"
    assert await qemu.accelerator(vm_env.artifacts, vm_env.run_root, "kvm") == "kvm"


async def test_qemu_that_cannot_start_is_an_error_and_leaves_nothing(vm_env: VmEnv) -> None:
    bad = VmConfig(
        kernel=vm_env.root / "no-such-kernel",
        initramfs=vm_env.config.initramfs,
        cgroup_parent=CGROUP_PARENT,
    )
    with pytest.raises(qemu.VmError, match="did not start"):
        await Vm.boot(vm_env.run_root, vm_env.new_id("bad"), bad, disk_base=vm_env.base)
