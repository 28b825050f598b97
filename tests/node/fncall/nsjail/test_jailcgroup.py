"""A jail's cgroups through the host's kept control-file descriptors, on the real
hierarchy (v1 here): each read is the kernel's current figure, each write reaches the
kernel, and removing the jail's groups closes every descriptor."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.fncall.nsjail import NsjailConfig
from node.fncall.nsjail.cgroups import CgroupMode, detect
from node.fncall.nsjail.jailcgroup import CPU_SHARES, START_CPU_SHARES, JailCgroup, V1JailCgroup

pytestmark = pytest.mark.nsjail

MIB = 1 << 20


@pytest.fixture
def jail_group() -> Iterator[V1JailCgroup]:
    setup = detect(NsjailConfig(cgroup_parent="CORRAL-TEST"))
    if setup.mode is not CgroupMode.V1:
        pytest.skip(f"these checks read v1 files; this host's cgroups: {setup.mode}")
    setup.ensure_parents()
    cgroup = setup.for_new_jail(
        f"kept-fds-{secrets.token_hex(4)}", memory_bytes=256 * MIB, pids=32, cpu_ms_per_sec=0
    )
    assert isinstance(cgroup, V1JailCgroup)
    try:
        yield cgroup
    finally:
        cgroup.remove()
        for mount in (setup.memory, setup.pids, setup.cpuacct):
            if mount is not None:
                (mount / setup.parent).rmdir()


def _run_in(cgroup: V1JailCgroup, code: str) -> None:
    """Run ``code`` in a Python process that joined the jail's groups first."""
    joins = "".join(
        f"open({str(group / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
        for group in cgroup.groups
    )
    subprocess.run([sys.executable, "-c", "import os\n" + joins + code], check=True, timeout=60)


def _fds_into(group: Path) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(group)):
            found.append(target)
    return found


def test_each_read_is_the_kernels_current_figure(jail_group: JailCgroup) -> None:
    assert isinstance(jail_group, V1JailCgroup)
    before = jail_group.cpu_usage_ns()
    assert before is not None
    _run_in(jail_group, "x = 0\nfor i in range(3_000_000):\n    x += i\n")
    after = jail_group.cpu_usage_ns()  # read again through the same descriptor
    assert after is not None and after - before > 10_000_000  # the loop's CPU, >10 ms
    assert jail_group.oom_kills() == 0
    _run_in(jail_group, "b = bytearray(40 << 20)\n")
    assert jail_group.reached_limit() is False  # peaked at ~50 MB of 256
    peak = int((jail_group.memory / "memory.max_usage_in_bytes").read_text())
    assert peak >= 40 * MIB
    jail_group.mark_peak()  # a write through a kept descriptor resets it
    assert int((jail_group.memory / "memory.max_usage_in_bytes").read_text()) < 40 * MIB


def test_writes_reach_the_kernel_every_time(jail_group: JailCgroup) -> None:
    assert isinstance(jail_group, V1JailCgroup)
    for memory_mb, pids in ((128, 16), (512, 64), (96, 8), (512, 64)):
        jail_group.set_limits(memory_bytes=memory_mb * MIB, pids=pids)
        assert int((jail_group.memory / "memory.limit_in_bytes").read_text()) == memory_mb * MIB
        assert (jail_group.pids / "pids.max").read_text().strip() == str(pids)
    _run_in(jail_group, "import os\nos.kill(os.getpid(), 0)\n")  # still usable


def test_removing_the_groups_closes_every_descriptor(jail_group: JailCgroup) -> None:
    assert isinstance(jail_group, V1JailCgroup)
    jail_group.mark_peak()
    jail_group.oom_kills()
    jail_group.cpu_usage_ns()
    jail_group.set_limits(memory_bytes=64 * MIB, pids=8)
    assert jail_group.open_files() >= 4
    assert _fds_into(jail_group.memory)
    jail_group.remove()
    assert jail_group.open_files() == 0
    assert not _fds_into(jail_group.memory) and not _fds_into(jail_group.pids)
    assert not jail_group.memory.exists() and not jail_group.pids.exists()
    assert jail_group.oom_kills() is None  # gone: a reading fails cleanly
    assert jail_group.open_files() == 0


def test_a_new_jail_group_weighs_a_start_until_the_start_ends() -> None:
    setup = detect(NsjailConfig(cgroup_parent="CORRAL-TEST"))
    if setup.mode is not CgroupMode.V1 or setup.cpu is None:
        pytest.skip(f"these checks read v1 cpu files; this host's cgroups: {setup.mode}")
    setup.ensure_parents()
    cgroup = setup.for_new_jail(
        f"weight-{secrets.token_hex(4)}", memory_bytes=256 * MIB, pids=32, cpu_ms_per_sec=1000
    )
    assert isinstance(cgroup, V1JailCgroup) and cgroup.cpu is not None
    try:
        assert int((cgroup.cpu / "cpu.shares").read_text()) == START_CPU_SHARES
        cgroup.end_start()
        assert int((cgroup.cpu / "cpu.shares").read_text()) == CPU_SHARES
    finally:
        cgroup.remove()
        for mount in {setup.memory, setup.pids, setup.cpu, setup.cpuacct}:
            if mount is not None:
                (mount / setup.parent).rmdir()
