"""Fixtures for real microVMs: a busybox image with a stand-in agent (a shell script that
answers lines on the ``corral.ctl`` port until the real agent lands), its kernel,
initramfs and base disk in a directory the VM user can reach, and a check that no QEMU,
run directory or cgroup outlives a test."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import pwd
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from node.sandboxes.base import RootImage
from node.sandboxes.microvm import qemu
from node.sandboxes.microvm.artifacts import Artifacts, find_kernel
from node.sandboxes.microvm.qemu import Template, Vm, VmConfig
from tests.node.sandboxes.conftest import make_rootfs
from tests.requirements import missing

CGROUP_PARENT = "corral-vm-test"
#: in every VM id ``VmEnv.new_id`` makes in this process
MINE = f"-{os.getpid()}-"
MIB = 1 << 20

# The stand-in agent: PID 1 after switch_root; reads "ID COMMAND ARG" lines on the ctl
# port and answers "ID RESULT".
STAND_IN = r"""#!/bin/sh
ctl=$2
echo "stand-in agent: pid $$, ctl $ctl, data $4"
while true; do
    exec 3<>"$ctl" || { sleep 0.1; continue; }
    while read -r id cmd arg <&3; do
        case "$cmd" in
            ping) r=pong ;;
            pid) r=$$ ;;
            write) echo "$arg" > /data.txt && sync && r=ok ;;
            read) r=$(cat /data.txt 2>/dev/null || echo none) ;;
            size) set -- $(df -k / | tail -n 1); r=$2 ;;
            owner) set -- $(stat -c '%u:%g:%a' /home/user); r=$1 ;;
            panic) echo c > /proc/sysrq-trigger ;;
            grow) r=$(/.corral/tools/lib/ld.so --library-path /.corral/tools/lib \
                      /.corral/tools/resize2fs /dev/vda 2>&1 >/dev/null) && r="ok" ;;
            *) r="unknown $cmd" ;;
        esac
        echo "$id $r" >&3
    done
    exec 3>&-
    sleep 0.1
done
"""


def microvm_unusable() -> str | None:
    if os.geteuid() != 0:
        return "the microVM tests need root (cgroups, the VM user)"
    for tool in ("qemu-system-x86_64", "qemu-img", "mkfs.ext4", "lz4", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup-microvm.sh)"
    try:
        find_kernel()
    except Exception as e:
        return str(e)
    try:
        pwd.getpwnam(qemu.VM_USER)
    except KeyError:
        return f"no user {qemu.VM_USER} (scripts/setup-microvm.sh)"
    if not (qemu.CGROUP_ROOT / "memory").is_dir():
        return "no cgroup v1 memory controller"
    return None


def require_microvm() -> None:
    reason = microvm_unusable()
    if reason is not None:
        missing(reason)


@dataclass
class VmEnv:
    root: Path
    artifacts: Artifacts
    image: RootImage
    base: Path
    config: VmConfig
    run_root: Path
    ids: Iterator[int]

    def new_id(self, prefix: str = "vm") -> str:
        return f"{prefix}{MINE}{next(self.ids)}"


@pytest.fixture(scope="module")
def vm_env() -> Iterator[VmEnv]:
    require_microvm()
    # QEMU runs as the VM user: every path it opens must be reachable by it (pytest's
    # own temporary directories are 0700)
    root = Path(tempfile.mkdtemp(prefix="corral-microvm-test-"))
    try:
        root.chmod(0o755)
        rootfs = make_rootfs(root / "rootfs")
        (rootfs / "bin" / "busybox").chmod(0o755)
        agent = root / "stand-in-agent"
        agent.write_text(STAND_IN)
        agent.chmod(0o755)
        artifacts = Artifacts(root / "var")
        image = RootImage(digest="sha256:microvm-test", rootfs=rootfs)
        config = VmConfig(
            kernel=artifacts.kernel(),
            initramfs=artifacts.initramfs(agent),
            memory_mib=192,
            cgroup_parent=CGROUP_PARENT,
        )
        yield VmEnv(
            root=root,
            artifacts=artifacts,
            image=image,
            base=artifacts.base_disk(image),
            config=config,
            run_root=root / "vms",
            ids=itertools.count(),
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def qemu_pids(marker: str) -> list[int]:
    """Live processes whose command line names ``marker`` (a run root)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
    return pids


def leftover_cgroups(only: str = "") -> list[Path]:
    """The VM cgroups under the tests' parent, those whose name holds ``only`` (``MINE``:
    the ones ``VmEnv.new_id`` named in this process, when other tests may run beside)."""
    found = []
    for controller in ("memory", "cpu"):
        parent = qemu.CGROUP_ROOT / controller / CGROUP_PARENT
        if parent.is_dir():
            found += [d for d in parent.iterdir() if d.is_dir() and only in d.name]
    return found


@pytest.fixture
def no_vm_leaks(vm_env: VmEnv) -> Iterator[None]:
    """Fails the test when a QEMU process, run directory or cgroup of it is left."""
    yield
    pids = qemu_pids(str(vm_env.run_root))
    dirs = sorted(p.name for p in vm_env.run_root.iterdir()) if vm_env.run_root.exists() else []
    cgroups = leftover_cgroups(MINE)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    for d in dirs:
        qemu.reap(vm_env.run_root, d, CGROUP_PARENT)
    assert (pids, dirs, cgroups) == ([], [], [])


class Agent:
    """The host's end of the stand-in agent's ctl port."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._ids = itertools.count(1)

    @classmethod
    async def connect(cls, vm: Vm, timeout: float = 30.0) -> tuple[Agent, float]:
        """Connect and wait for the agent's first answer; (the agent, seconds waited)."""
        started = time.monotonic()
        reader, writer = await asyncio.open_unix_connection(str(vm.ctl_socket))
        agent = cls(reader, writer)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    ident = f"p{next(agent._ids)}"
                    writer.write(f"{ident} ping\n".encode())
                    await writer.drain()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.25):
                            line = await reader.readline()
                            if line.split(b" ")[1:2] == [b"pong\n"]:
                                break
        except BaseException:
            agent.close()
            raise
        return agent, time.monotonic() - started

    async def ask(self, command: str, timeout: float = 10.0) -> str:
        ident = f"q{next(self._ids)}"
        self.writer.write(f"{ident} {command}\n".encode())
        await self.writer.drain()
        async with asyncio.timeout(timeout):
            while True:
                line = (await self.reader.readline()).decode()
                if not line:
                    raise ConnectionError("the agent's port closed")
                got, _, result = line.rstrip("\n").partition(" ")
                if got == ident:
                    return result

    def close(self) -> None:
        self.writer.close()


def sock_closed(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except OSError:
            return True
    return False


@pytest.fixture(scope="module")
def template(vm_env: VmEnv) -> Template:
    """One saved template (booted cold, the stand-in answering, "template-data" written
    to its disk), shared by the module's tests (its files go with ``vm_env``'s)."""
    return asyncio.run(_make_template(vm_env))


async def _make_template(vm_env: VmEnv) -> Template:
    memory = vm_env.root / "templates" / "t.ram"
    config = VmConfig(
        kernel=vm_env.config.kernel,
        initramfs=vm_env.config.initramfs,
        memory_mib=vm_env.config.memory_mib,
        memory_file=memory,
        cgroup_parent=CGROUP_PARENT,
    )
    vm = await Vm.boot(
        vm_env.run_root, vm_env.new_id("tmpl"), config, disk_base=vm_env.base,
        disk_size=96 * MIB, shared=True,
    )  # fmt: skip
    try:
        agent, waited = await Agent.connect(vm)
        try:
            print(f"template: cold boot to the agent {waited:.2f} s")
            assert await agent.ask("write template-data") == "ok"
        finally:
            agent.close()
        started = time.monotonic()
        tmpl = await vm.save_template(
            vm_env.root / "templates" / "t.state", vm_env.root / "templates" / "t.qcow2"
        )
        print(
            f"template: saved in {time.monotonic() - started:.3f} s, "
            f"state {tmpl.state.stat().st_size} bytes"
        )
    finally:
        await vm.kill()
    return tmpl
