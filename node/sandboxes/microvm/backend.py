"""MicroVM sandboxes: each a QEMU ``-M microvm`` guest with a kernel of its own, restored
from a template snapshot, driven by the guest agent over virtio-serial.

A create finds (or makes, once per image and size) a **template**: a VM booted cold with
its RAM in a shared file, its root file system grown to the size asked, the agent
answering, then saved (device state only: ``x-ignore-shared``; its disk kept read-only).
The sandbox is a **clone** of it: QEMU started on the same RAM file mapped privately
(copy-on-write over one page-cache copy, shared by every clone) with ``-incoming``, its
own qcow2 overlay over the template's disk, running on from where the template was saved
(``node.sandboxes.microvm.qemu``). The host then connects to the agent's ports and says
HELLO: the guest's wall clock, fresh entropy (clones of one template share RNG state),
its own hostname and machine id. Commands and file calls go to the agent
(``channel.AgentChannel``), which runs each as the user asked inside the guest, whose
kernel enforces that user's rights.

QEMU runs unprivileged (the ``corral-vm`` user), under ``-sandbox on``, in a v1 cgroup of
its own with the VM's memory and CPU; the VM has no network device (a sandbox asking for
one is refused: 501). A VM that ends by itself (a guest panic, a power-off, QEMU killed)
is seen at once and its sandbox reported ended. Leftover VMs of an earlier node process
are returned by ``start`` for the manager to destroy (``qemu.reap``).

Warm clones: the node's warm pool (``node.sandboxes.warm``) keeps clones restored and
paused (QEMU stopped: no guest CPU), and a create of the warm shape (the default size)
claims one: QEMU goes on, a second HELLO gives it the sandbox's clock, entropy, hostname
and machine id, and its run directory answers to the sandbox's id through a symlink.

A snapshot is the whole machine: the guest stopped, its state (RAM included) and a copy of
its disk written, the guest let go on, and the pair loaded into a new shared memory file
and saved as a template of its own, so a sandbox made from it (a fork) is a clone that
runs on from that moment, with the parent's processes.

Not yet: networks (docs/microvm.md says what is left).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from node.sandboxes import rooted
from node.sandboxes.base import (
    BackendUnavailable,
    DiskFull,
    FileStream,
    FileTooLarge,
    NotADirectory,
    NotATerminal,
    PathExists,
    PathNotFound,
    PermissionDenied,
    RootImage,
    SandboxBackend,
    SandboxError,
    SandboxNotFound,
    SandboxNotRunning,
    SandboxPathError,
    SandboxUnresponsive,
    SnapshotFiles,
    SnapshotNotFound,
    Unsupported,
    Usage,
)
from node.sandboxes.microvm import qemu
from node.sandboxes.microvm.artifacts import Artifacts
from node.sandboxes.microvm.channel import (
    AgentChannel,
    AgentError,
    AgentGone,
    Entry,
    GuestProcess,
)
from node.sandboxes.microvm.initramfs import GROW_FS_ARGV
from node.sandboxes.microvm.process import VmProcess
from wire.sandboxes import (
    MAX_PAGE,
    EntryPage,
    ExecRequest,
    FileEntry,
    FileType,
    Phases,
    SandboxSpec,
)

log = logging.getLogger(__name__)

DEFAULT_AGENT = Path(__file__).resolve().parents[1] / "guest" / "bin" / "corral-vmagent"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MIB = 1 << 20
#: how long a cold boot may take to reach the agent (TCG boots in seconds)
BOOT_TIMEOUT_S = 120.0
#: how long a restored clone's agent may take to answer
RESTORE_TIMEOUT_S = 30.0
#: a file call, or a command's start, with no answer in this long: the guest is unresponsive
CALL_TIMEOUT_S = 30.0

_ERRORS: dict[str, type[SandboxError]] = {
    "path_not_found": PathNotFound,
    "path_exists": PathExists,
    "not_a_directory": NotADirectory,
    "permission_denied": PermissionDenied,
    "invalid_path": SandboxPathError,
    "file_too_large": FileTooLarge,
    "disk_full": DiskFull,
    "not_a_terminal": NotATerminal,
    "no_such_user": SandboxPathError,
    "too_many": SandboxUnresponsive,
}


def _mapped(sandbox_id: str, error: AgentError | AgentGone) -> SandboxError:
    """The agent's answer as the sandbox error the node's API gives."""
    if isinstance(error, AgentGone):
        return SandboxUnresponsive(f"sandbox {sandbox_id}: its guest agent does not answer")
    kind = _ERRORS.get(error.code, SandboxError)
    return kind(error.message or error.code)


def _entry(entry: Entry) -> FileEntry:
    kind = entry.get("type", "other")
    return FileEntry(
        name=entry["name"],
        path=entry["path"],
        type=FileType(kind) if kind in FileType.__members__.values() else FileType.OTHER,
        size=int(entry.get("size") or 0),
        mode=int(entry.get("mode") or "0", 8),
        # the ids, as every backend gives them (the agent sends the names too)
        owner=entry.get("uid", ""),
        group=entry.get("gid", ""),
        modified_at=int(entry.get("mtime_ns") or 0) / 1e9,
        symlink_target=entry.get("target") if kind == "symlink" else None,
    )


@dataclass
class _Machine:
    """One sandbox's VM, its agent, and what the sandbox was made with."""

    vm: qemu.Vm
    channel: AgentChannel
    spec: SandboxSpec
    env: dict[str, str]
    workdir: str
    accounts: dict[str, rooted.Account]
    paused: bool = False
    processes: set[VmProcess] = field(default_factory=set)
    watcher: asyncio.Task[None] | None = None


@dataclass(frozen=True)
class _Snapshot:
    """A sandbox's machine saved (``MicrovmBackend.snapshot``): a template of its own."""

    template: qemu.Template
    spec: SandboxSpec  #: the sandbox's it was taken of (its shape)
    directory: Path


def _allocated(directory: Path) -> int:
    """Bytes the files under ``directory`` take on disk."""
    return sum(p.stat().st_blocks * 512 for p in directory.rglob("*") if p.is_file())


class _FileStream(FileStream):
    def __init__(self, size: int, chunks: AsyncIterator[bytes], sandbox_id: str) -> None:
        self.size = size
        self._chunks = chunks
        self._sandbox_id = sandbox_id

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._chunks:
                yield chunk
        except (AgentError, AgentGone) as e:
            raise _mapped(self._sandbox_id, e) from None

    async def close(self) -> None:
        closer = getattr(self._chunks, "aclose", None)
        if closer is not None:
            with contextlib.suppress(Exception):
                await closer()


def _vcpus(cpu: float) -> int:
    """The vCPUs a VM of ``cpu`` cores gets (whole ones, at least one)."""
    return max(1, int(-(-cpu // 1)))


def _shape(spec: SandboxSpec) -> tuple[int, int, int]:
    """What a VM is made with and keeps: guest memory, vCPUs and disk."""
    return (spec.memory_mb, _vcpus(spec.cpu), spec.disk_mb)


class MicrovmBackend(SandboxBackend):
    name = "microvm"
    #: a paused clone's QEMU as the host sees it (PSS with its share of the template's
    #: pages, bench/microvm.py: 40.0 MiB under TCG, docs/benchmarks.md)
    warm_memory_mb = 40.0

    def __init__(
        self,
        data_dir: Path,
        *,
        root: Path | None = None,
        accelerator: Literal["auto", "kvm", "tcg"] = "auto",
        agent_binary: Path | None = None,
        vm_user: str | None = qemu.VM_USER,
        cgroup_parent: str | None = "corral-vm",
        tb_size_mib: int = 64,
    ) -> None:
        """``root`` (default ``<data_dir>/microvm``): where the kernel, initramfs, disks,
        templates and VMs live (QEMU runs as ``vm_user``, so every directory above it must
        be reachable by that user); ``accelerator``: ``auto`` probes KVM once, else forced."""
        self.root = (root or data_dir / "microvm").resolve()
        self.run_root = self.root / "vms"
        self.templates_dir = self.root / "templates"
        self.snapshots_dir = self.root / "snapshots"
        self.artifacts = Artifacts(self.root)
        self.agent_binary = agent_binary or DEFAULT_AGENT
        self._force = accelerator
        self._vm_user = vm_user
        self._cgroup_parent = cgroup_parent
        self._tb_size_mib = tb_size_mib
        self._accelerator: qemu.Accel | None = None
        self._kernel: Path | None = None
        self._initramfs: Path | None = None
        self._machines: dict[str, _Machine] = {}
        self._templates: dict[str, qemu.Template] = {}
        self._snapshots: dict[str, _Snapshot] = {}
        self._making: dict[str, asyncio.Future[qemu.Template]] = {}

    @property
    def accelerator(self) -> str | None:
        return self._accelerator

    # --- set-up ---------------------------------------------------------------------------
    async def start(self) -> list[str]:
        if not self.agent_binary.exists():
            raise BackendUnavailable(
                f"{self.agent_binary} is missing: run scripts/setup-sandboxes.sh"
            )
        if shutil.which("qemu-system-x86_64") is None or shutil.which("qemu-img") is None:
            raise BackendUnavailable("QEMU is not installed: run scripts/setup-microvm.sh")
        await asyncio.to_thread(self._make_dirs)
        self._kernel = await asyncio.to_thread(self.artifacts.kernel)
        self._initramfs = await asyncio.to_thread(self.artifacts.initramfs, self.agent_binary)
        self._accelerator = await qemu.accelerator(
            self.artifacts, self.run_root, self._force, user=self._vm_user
        )
        log.info("microvm: VMs run under %s", self._accelerator)
        return await asyncio.to_thread(qemu.leftovers, self.run_root)

    def _make_dirs(self) -> None:
        for directory in (self.root, self.run_root):
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o755)
        # templates are made again by each node process (same QEMU, same command line);
        # snapshots are templates too, and stand on them: they go with the process
        for directory in (self.templates_dir, self.snapshots_dir):
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(mode=0o755)
        if self._vm_user is not None:
            for parent in self.root.parents:
                if parent.stat().st_mode & 0o001 == 0:
                    raise BackendUnavailable(
                        f"{parent} is not reachable by the VM user {self._vm_user} "
                        f"(mode {parent.stat().st_mode & 0o777:o}): give the node a data "
                        "directory others may traverse"
                    )

    async def close(self) -> None:
        for making in self._making.values():
            making.cancel()

    # --- templates ------------------------------------------------------------------------
    def _config(self, memory_mib: int, vcpus: int, memory_file: Path | None) -> qemu.VmConfig:
        assert self._kernel is not None and self._initramfs is not None
        assert self._accelerator is not None
        return qemu.VmConfig(
            kernel=self._kernel,
            initramfs=self._initramfs,
            memory_mib=memory_mib,
            vcpus=vcpus,
            accelerator=self._accelerator,
            tb_size_mib=self._tb_size_mib,
            memory_file=memory_file,
            user=self._vm_user,
            cgroup_parent=self._cgroup_parent,
        )

    async def _template(self, image: RootImage, spec: SandboxSpec) -> qemu.Template:
        """The template for this image and size: made once (concurrent creates wait for
        the one being made; a failed making is tried again by the next create)."""
        vcpus = _vcpus(spec.cpu)
        key = hashlib.sha256(
            f"{image.digest}|{spec.memory_mb}|{vcpus}|{spec.disk_mb}".encode()
        ).hexdigest()[:20]
        found = self._templates.get(key)
        if found is not None:
            return found
        making = self._making.get(key)
        if making is None:
            making = self._making[key] = asyncio.get_running_loop().create_future()
            try:
                template = await self._make_template(key, image, spec, vcpus)
            except BaseException as e:
                del self._making[key]
                making.set_exception(e)
                making.exception()  # retrieved: the waiters, if any, get it too
                raise
            self._templates[key] = template
            del self._making[key]
            making.set_result(template)
            return template
        return await asyncio.shield(making)

    async def _make_template(
        self, key: str, image: RootImage, spec: SandboxSpec, vcpus: int
    ) -> qemu.Template:
        started = time.monotonic()
        base = await asyncio.to_thread(self.artifacts.base_disk, image)
        base_size = base.stat().st_size
        config = self._config(spec.memory_mb, vcpus, self.templates_dir / f"{key}.ram")
        vm = await qemu.Vm.boot(
            self.run_root,
            f"template-{key}",
            config,
            disk_base=base,
            disk_size=base_size + spec.disk_mb * MIB,
            shared=True,
        )
        try:
            channel = await self._reach(vm, BOOT_TIMEOUT_S)
            try:
                grown = await channel.exec(
                    argv=list(GROW_FS_ARGV),
                    env={"PATH": DEFAULT_PATH},
                    cwd="/",
                    user="root",
                    stdin=False,
                    pty=None,
                )
                status, output = await _gather(grown)
                if status != 0:
                    raise BackendUnavailable(
                        f"the template's disk could not grow (status {status}): "
                        + output[-500:].decode(errors="replace")
                    )
                # what every clone's first command reads (a shell, the C library) is then
                # in the template's page cache, not read again by each clone
                for warm in (["sh", "-c", "true"], ["true"]):
                    await _gather(
                        await channel.exec(
                            argv=warm,
                            env={"PATH": DEFAULT_PATH},
                            cwd="/",
                            user="root",
                            stdin=False,
                            pty=None,
                        )
                    )
            finally:
                await channel.close()
            # the agent notices the host has gone and waits for the next one (a clone's)
            await asyncio.sleep(0.3)
            template = await vm.save_template(
                self.templates_dir / f"{key}.state", self.templates_dir / f"{key}.qcow2"
            )
        except BaseException:
            with contextlib.suppress(Exception):
                await vm.kill()
            raise
        log.info(
            "microvm: template %s of %s (%d MiB, %d vCPU, disk +%d MiB) made in %.2f s",
            key,
            image.digest,
            spec.memory_mb,
            vcpus,
            spec.disk_mb,
            time.monotonic() - started,
        )
        return template

    async def _reach(self, vm: qemu.Vm, timeout_s: float) -> AgentChannel:
        """The VM's agent, once it answers a ping (the guest may still be booting)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if vm.ended is not None:
                raise SandboxUnresponsive(
                    f"the VM ended before its agent answered: {vm.serial_tail(800)!r}"
                )
            channel: AgentChannel | None = None
            try:
                channel = await AgentChannel.connect(
                    str(vm.ctl_socket), str(vm.data_socket), timeout=5.0, name=vm.id
                )
                await channel.ping(timeout=min(5.0, max(0.5, deadline - time.monotonic())))
                return channel
            except AgentGone:
                if channel is not None:
                    await channel.close()
                if time.monotonic() > deadline:
                    raise SandboxUnresponsive(
                        f"VM {vm.id}: no answer from its agent in {timeout_s:.0f} s: "
                        f"{vm.serial_tail(800)!r}"
                    ) from None
                await asyncio.sleep(0.05)

    # --- lifecycle ------------------------------------------------------------------------
    async def create(self, spec: SandboxSpec, image: RootImage) -> Phases:
        if not spec.network.isolated:
            raise Unsupported("microVM sandboxes have no network yet (network: none)")
        if spec.sandbox_id in self._machines:
            raise SandboxError(f"sandbox {spec.sandbox_id} exists")
        started = time.monotonic()
        if image.layers:  # a snapshot's machine (the manager names its directory)
            template = self._snapshot_template(image.layers[0].name, spec)
        else:
            template = await self._template(image, spec)
        prepared = time.monotonic()
        vm = await qemu.Vm.restore(self.run_root, spec.sandbox_id, template)
        try:
            channel = await self._reach(vm, RESTORE_TIMEOUT_S)
            machine = _Machine(
                vm=vm,
                channel=channel,
                spec=spec,
                env=dict(image.env),
                workdir=spec.workdir or "",
                accounts=await asyncio.to_thread(rooted.image_accounts, image.rootfs),
            )
            if not machine.workdir and image.workdir not in ("", "/"):
                machine.workdir = image.workdir
            await channel.hello(
                time_ns=time.time_ns(),
                entropy=os.urandom(64),
                hostname=spec.sandbox_id[:63],
                machine_id=uuid.uuid4().hex,
                pids=spec.pids,
            )
        except BaseException:
            with contextlib.suppress(Exception):
                await vm.kill()
            raise
        machine.watcher = asyncio.create_task(
            self._watch(machine), name=f"microvm-watch-{spec.sandbox_id}"
        )
        self._machines[spec.sandbox_id] = machine
        done = time.monotonic()
        log.info(
            "sandbox=%s: microVM restored in %.0f ms (%s)",
            spec.sandbox_id,
            (done - prepared) * 1000,
            self._accelerator,
        )
        return Phases(setup_ms=(prepared - started) * 1000, start_ms=(done - prepared) * 1000)

    def _snapshot_template(self, snapshot_id: str, spec: SandboxSpec) -> qemu.Template:
        snapshot = self._snapshots.get(snapshot_id)
        if snapshot is None:
            raise SnapshotNotFound(f"no snapshot {snapshot_id} of a microVM on this node")
        if _shape(snapshot.spec) != _shape(spec):
            memory, vcpus, disk = _shape(snapshot.spec)
            raise Unsupported(
                f"a microVM made from snapshot {snapshot_id} has its machine's size: "
                f"memory_mb={memory}, {vcpus} vCPU, disk_mb={disk}"
            )
        return snapshot.template

    async def _watch(self, machine: _Machine) -> None:
        """Until the VM ends by itself: then its agent is closed (its calls fail)."""
        ended = await machine.vm.wait()
        log.warning(
            "sandbox=%s: its VM ended (QEMU status %s, %s): %r",
            machine.spec.sandbox_id,  # a claimed warm VM's new id
            ended.returncode,
            ended.reason,
            machine.vm.serial_tail(400),
        )
        await machine.channel.close()

    def claimable(self, warm: SandboxSpec, spec: SandboxSpec) -> bool:
        """A VM keeps the memory, vCPUs and disk it was restored with: only a create of
        the same shape (and no network) can claim it."""
        return _shape(warm) == _shape(spec) and spec.network.isolated

    async def claim(self, warm_id: str, spec: SandboxSpec) -> None:
        machine = self._machines.get(warm_id)
        if machine is None:
            raise SandboxNotFound(f"no warm sandbox {warm_id}")
        if spec.sandbox_id in self._machines:
            raise SandboxError(f"sandbox {spec.sandbox_id} exists")
        if not self.claimable(machine.spec, spec):
            raise SandboxError(f"warm VM {warm_id} is not of the shape {spec.sandbox_id} asks")
        await asyncio.to_thread(qemu.alias, self.run_root, spec.sandbox_id, warm_id)
        try:
            if machine.paused:
                await machine.vm.resume()
                machine.paused = False
            await machine.channel.hello(  # a new identity: the warm clone's was its own
                time_ns=time.time_ns(),
                entropy=os.urandom(64),
                hostname=spec.sandbox_id[:63],
                machine_id=uuid.uuid4().hex,
                pids=spec.pids,
            )
        except (AgentError, AgentGone) as e:
            await asyncio.to_thread(qemu.unalias, self.run_root, spec.sandbox_id)
            raise _mapped(spec.sandbox_id, e) from None
        except BaseException:
            await asyncio.to_thread(qemu.unalias, self.run_root, spec.sandbox_id)
            raise
        machine.spec = spec
        if spec.workdir:
            machine.workdir = spec.workdir
        self._machines[spec.sandbox_id] = self._machines.pop(warm_id)
        log.info("sandbox=%s: claimed the warm VM %s", spec.sandbox_id, warm_id)

    async def destroy(self, sandbox_id: str) -> None:
        machine = self._machines.pop(sandbox_id, None)
        if machine is None:
            await asyncio.to_thread(qemu.reap, self.run_root, sandbox_id, self._cgroup_parent)
            return
        try:
            await machine.channel.close()
        finally:
            if machine.watcher is not None:
                machine.watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await machine.watcher
            await machine.vm.kill()
            if machine.vm.id != sandbox_id:  # a claimed warm VM: its alias goes too
                await asyncio.to_thread(qemu.unalias, self.run_root, sandbox_id)

    def _get(self, sandbox_id: str) -> _Machine:
        machine = self._machines.get(sandbox_id)
        if machine is None:
            raise SandboxNotFound(f"no sandbox {sandbox_id}")
        return machine

    def _runnable(self, sandbox_id: str) -> _Machine:
        machine = self._get(sandbox_id)
        if machine.paused:
            raise SandboxNotRunning(f"sandbox {sandbox_id} is paused")
        if machine.vm.ended is not None or machine.channel.closed:
            raise SandboxNotRunning(f"sandbox {sandbox_id} has ended (its VM stopped)")
        return machine

    async def pause(self, sandbox_id: str) -> None:
        machine = self._get(sandbox_id)
        await machine.vm.pause()
        machine.paused = True

    async def resume(self, sandbox_id: str) -> None:
        machine = self._get(sandbox_id)
        await machine.vm.resume()
        machine.paused = False

    # --- commands -------------------------------------------------------------------------
    def _account(self, machine: _Machine, user: str) -> rooted.Account:
        found = rooted.find(user, machine.accounts)
        if found is not None:
            return found
        if user == "root":
            return rooted.ROOT
        ids = rooted.numeric(user)
        if ids is not None:
            return rooted.Account(str(ids[0]), ids[0], ids[1] or ids[0], "/")
        # a user the sandbox added itself: the agent finds it in the guest's /etc/passwd
        return rooted.Account(user, -1, -1, "/")

    async def _call[T](self, sandbox_id: str, call: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                return await call
        except TimeoutError:
            raise SandboxUnresponsive(
                f"sandbox {sandbox_id}: its guest agent did not answer in {CALL_TIMEOUT_S:.0f} s"
            ) from None
        except (AgentError, AgentGone) as e:
            raise _mapped(sandbox_id, e) from None

    async def exec(self, sandbox_id: str, request: ExecRequest, *, default_user: str) -> VmProcess:
        machine = self._runnable(sandbox_id)
        user = request.user or default_user
        account = self._account(machine, user)
        env = {
            **({"TERM": "xterm-256color"} if request.pty is not None else {}),
            "PATH": DEFAULT_PATH,
            "HOME": account.home,
            "USER": account.name,
            "LOGNAME": account.name,
            "LANG": "C.UTF-8",
            **machine.env,
            **machine.spec.env,
            **request.env,
        }
        start = request.cwd or machine.workdir or account.home or "/"
        cwd = rooted.normalise(start, home=account.home)
        pty = None if request.pty is None else (request.pty.cols, request.pty.rows)
        guest = await self._call(
            sandbox_id,
            machine.channel.exec(
                argv=request.cmd,
                env=env,
                cwd=cwd,
                user=user,
                stdin=request.stdin is not None or request.stdin_open or pty is not None,
                pty=pty,
            ),
        )
        process = VmProcess(
            guest,
            sandbox_id=sandbox_id,
            terminal=pty is not None,
            timeout_s=request.timeout_s,
            max_output_bytes=request.max_output_bytes,
            on_exit=lambda: machine.processes.discard(process),
        )
        machine.processes.add(process)
        if request.stdin is not None:
            await process.write_stdin(request.stdin.encode())
        if pty is None and request.stdin is not None:
            await process.close_stdin()
        return process

    # --- files ----------------------------------------------------------------------------
    def _path(self, machine: _Machine, path: str, user: str) -> str:
        return rooted.normalise(path, home=self._account(machine, user).home)

    async def read_file(
        self, sandbox_id: str, path: str, *, user: str, max_bytes: int
    ) -> FileStream:
        machine = self._runnable(sandbox_id)
        where = self._path(machine, path, user)
        entry, chunks = await self._call(
            sandbox_id, machine.channel.read_file(where, user=user, max_bytes=max_bytes)
        )
        return _FileStream(int(entry.get("size") or 0), chunks, sandbox_id)

    async def write_file(
        self,
        sandbox_id: str,
        path: str,
        chunks: AsyncIterable[bytes],
        *,
        user: str,
        mode: int = 0o644,
    ) -> FileEntry:
        machine = self._runnable(sandbox_id)
        where = self._path(machine, path, user)
        try:  # no overall timeout: the bytes come as fast as the caller sends them
            written = await machine.channel.write_file(where, chunks, user=user, mode=mode)
        except (AgentError, AgentGone) as e:
            raise _mapped(sandbox_id, e) from None
        return _entry(written)

    async def list_dir(
        self,
        sandbox_id: str,
        path: str,
        *,
        user: str,
        depth: int = 1,
        limit: int = MAX_PAGE,
        cursor: str | None = None,
    ) -> EntryPage:
        machine = self._runnable(sandbox_id)
        where = self._path(machine, path, user)
        after = ""
        if cursor:
            try:
                after = bytes.fromhex(cursor).decode("utf-8", "surrogateescape")
            except ValueError:
                raise SandboxPathError("the cursor is not one a listing gave") from None
        entries = await self._call(
            sandbox_id, machine.channel.list_dir(where, user=user, depth=depth)
        )
        rest = [
            e
            for e in entries
            if e["path"].encode("utf-8", "surrogateescape")
            > after.encode("utf-8", "surrogateescape")
        ]
        page = rest[:limit]
        more = len(rest) > limit and bool(page)
        next_cursor = page[-1]["path"].encode("utf-8", "surrogateescape").hex() if more else None
        return EntryPage(entries=[_entry(e) for e in page], next_cursor=next_cursor)

    async def stat(self, sandbox_id: str, path: str, *, user: str) -> FileEntry:
        machine = self._runnable(sandbox_id)
        where = self._path(machine, path, user)
        return _entry(await self._call(sandbox_id, machine.channel.stat(where, user=user)))

    async def make_dir(self, sandbox_id: str, path: str, *, user: str) -> FileEntry:
        machine = self._runnable(sandbox_id)
        where = self._path(machine, path, user)
        return _entry(await self._call(sandbox_id, machine.channel.make_dir(where, user=user)))

    async def remove(self, sandbox_id: str, path: str, *, user: str) -> None:
        machine = self._runnable(sandbox_id)
        where = self._path(machine, path, user)
        await self._call(sandbox_id, machine.channel.remove(where, user=user))

    async def move(self, sandbox_id: str, source: str, destination: str, *, user: str) -> FileEntry:
        machine = self._runnable(sandbox_id)
        moved = machine.channel.move(
            self._path(machine, source, user), self._path(machine, destination, user), user=user
        )
        return _entry(await self._call(sandbox_id, moved))

    # --- usage ----------------------------------------------------------------------------
    async def usage(self, sandbox_id: str) -> Usage:
        machine = self._get(sandbox_id)
        vm = machine.vm
        return await asyncio.to_thread(_usage, vm)

    # --- snapshots (not yet) --------------------------------------------------------------
    # --- snapshots ------------------------------------------------------------------------
    async def snapshot(self, sandbox_id: str, snapshot_id: str) -> SnapshotFiles:
        """The sandbox's whole machine now (memory, disk, its processes): the guest stops
        while its state is written, then runs on; the snapshot is made a template, so a
        sandbox created from it is a clone that runs on from this moment."""
        machine = self._get(sandbox_id)
        qemu.check_id(snapshot_id)
        if snapshot_id in self._snapshots:
            raise SandboxError(f"snapshot {snapshot_id} exists")
        directory = self.snapshots_dir / snapshot_id
        started = time.monotonic()
        await asyncio.to_thread(directory.mkdir, 0o755)
        try:
            full, parent_disk = directory / "full.state", directory / "parent.qcow2"
            await machine.vm.save_snapshot(full, parent_disk)
            config = dataclasses.replace(machine.vm.config, memory_file=directory / "memory")
            template = await qemu.Vm.template_of_snapshot(
                self.run_root,
                f"snapshot-{snapshot_id}",
                config,
                state=full,
                disk=parent_disk,
                template_state=directory / "state",
                template_disk=directory / "disk.qcow2",
            )
            await asyncio.to_thread(full.unlink)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, directory, True)
            raise
        self._snapshots[snapshot_id] = _Snapshot(template, machine.spec, directory)
        size = await asyncio.to_thread(_allocated, directory)
        log.info(
            "sandbox=%s: snapshot %s of its machine made in %.2f s (%d MiB)",
            sandbox_id,
            snapshot_id,
            time.monotonic() - started,
            size // MIB,
        )
        return SnapshotFiles(snapshot_id=snapshot_id, layer=directory, size_bytes=size)

    def snapshot_layer(self, snapshot_id: str) -> SnapshotFiles | None:
        snapshot = self._snapshots.get(snapshot_id)
        if snapshot is None:
            return None
        return SnapshotFiles(
            snapshot_id=snapshot_id,
            layer=snapshot.directory,
            size_bytes=_allocated(snapshot.directory),
        )

    async def delete_snapshot(self, snapshot_id: str) -> None:
        snapshot = self._snapshots.pop(snapshot_id, None)
        if snapshot is not None:
            await asyncio.to_thread(shutil.rmtree, snapshot.directory, True)


async def _gather(process: GuestProcess) -> tuple[int | None, bytes]:
    """A guest process's exit code (None if killed) and its output, for the node's own
    short commands."""
    output = bytearray()
    status: int | None = None
    try:
        async with asyncio.timeout(BOOT_TIMEOUT_S):
            async for kind, value in process.events():
                if kind == "exit":
                    assert isinstance(value, int)
                    status = (value >> 8) & 0xFF if value & 0x7F == 0 else None
                elif isinstance(value, bytes) and len(output) < 1 << 16:
                    output += value
    finally:
        await process.release()
    return status, bytes(output)


def _usage(vm: qemu.Vm) -> Usage:
    """What the VM costs the host: QEMU's proportional memory (its share of the template's
    pages counted once across clones), its CPU time, its disk overlay's blocks."""
    ended = vm.ended is not None
    memory = cpu = disk = None
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{vm.pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                memory = int(line.split()[1]) * 1024
                break
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{vm.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        cpu = (int(fields[11]) + int(fields[12])) * 1000 / ticks
    with contextlib.suppress(OSError):
        disk = vm.disk.stat().st_blocks * 512
    return Usage(memory_bytes=memory, cpu_ms=cpu, disk_bytes=disk, ended=ended)
