"""One microVM: a QEMU 7.2 ``-M microvm`` process, its run directory and its controls.

A VM lives in ``<run_root>/<id>/``: ``qmp.sock`` (QEMU's monitor), ``ctl.sock`` and
``data.sock`` (the agent's virtio-serial ports ``corral.ctl`` / ``corral.data``, served by
QEMU), ``disk.qcow2`` (its overlay), ``serial.log`` (the guest console, size-capped),
``qemu.log`` (QEMU's own stderr, capped) and ``pid``. QEMU runs as the unprivileged
``corral-vm`` user (``setpriv``: no groups but kvm, no capabilities, no_new_privs) under
``-sandbox on`` (seccomp: no spawning, no privilege changes), in a cgroup v1 of its own
(memory: guest RAM + ``memory_overhead_mib``; cpu: ``vcpus`` cores of quota).

* ``await Vm.boot(run_root, id, config, disk_base=…, disk_size=…)``: a cold boot;
* ``await vm.save_template(state, disk)``: with the guest RAM in ``config.memory_file``
  (booted ``shared=True``), saves only the device state (``x-ignore-shared``) and the disk,
  then QEMU quits: a ``Template``;
* ``await Vm.restore(run_root, id, template)``: a clone (RAM ``share=off`` over the
  template's file, copy-on-write; ``-incoming defer`` + ``migrate-incoming``);
* ``pause``/``resume`` (QMP stop/cont), ``kill`` (SIGKILL, run dir and cgroups removed),
  ``wait`` (how it ended); ``leftovers``/``reap`` for VMs a previous node process left.

``accelerator()`` says which accelerator VMs use here: KVM only when ``/dev/kvm`` opens and
a probe boot under KVM reaches its init; else TCG (docs/microvm.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from node.sandboxes.base import BackendUnavailable, SandboxError, SandboxNotRunning, Unsupported
from node.sandboxes.microvm.artifacts import Artifacts, make_overlay
from node.sandboxes.microvm.initramfs import CTL_PORT, DATA_PORT
from node.sandboxes.microvm.qmp import Qmp, QmpError

log = logging.getLogger(__name__)

Accel = Literal["kvm", "tcg"]
CGROUP_ROOT = Path("/sys/fs/cgroup")
VM_USER = "corral-vm"
MIB = 1 << 20
KVM_PROBE_TIMEOUT_S = 10.0
_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# the wrapper QEMU starts under: joins the cgroups (each file named before "--"), then
# execs the rest (setpriv … qemu)
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
PROBE_MARK = "corral-kvm-probe-ok"
PROBE_INIT = f"""#!/bin/busybox sh
/bin/busybox echo {PROBE_MARK}
/bin/busybox reboot -f
"""


class VmError(SandboxError):
    """QEMU could not start, or a VM operation failed (the VM is gone or unusable)."""

    status, code = 503, "sandbox_unresponsive"


@dataclass(frozen=True, slots=True)
class VmConfig:
    """What a VM is made of. A clone must use its template's config (the same command
    line); only the run directory and disk differ."""

    kernel: Path
    initramfs: Path
    memory_mib: int = 256
    vcpus: int = 1
    accelerator: Accel = "tcg"
    #: TCG's translated-code cache (QEMU's default is 1 GiB per VM)
    tb_size_mib: int = 64
    #: guest RAM in this file (a template's memory); None: anonymous memory
    memory_file: Path | None = None
    cmdline: str = ""
    #: the user QEMU runs as; None: as the node's own (tests, development only)
    user: str | None = VM_USER
    #: v1 cgroups ``<controller>/<cgroup_parent>/<id>``; None: no cgroup
    cgroup_parent: str | None = "corral-vm"
    memory_overhead_mib: int = 160
    serial_max_bytes: int = 256 * 1024
    qemu: str = "qemu-system-x86_64"


@dataclass(frozen=True, slots=True)
class Template:
    """A saved template: clones restore ``state`` over ``memory`` (the config's memory
    file) with an overlay over ``disk``."""

    config: VmConfig
    state: Path
    disk: Path


@dataclass(frozen=True, slots=True)
class Ended:
    returncode: int | None
    #: QEMU's SHUTDOWN reason when it said one ("guest-reset": a reboot or a panic;
    #: "guest-shutdown", "host-qmp-quit"); None when it was killed
    reason: str | None


def kernel_cmdline(config: VmConfig) -> str:
    args = ["console=ttyS0", "reboot=t", "panic=-1", "quiet"]
    if config.accelerator == "tcg":
        args.append("tsc_early_khz=2000000")  # else it hangs calibrating against the PIT
    if config.cmdline:
        args.append(config.cmdline)
    return " ".join(args)


def qemu_argv(
    config: VmConfig,
    run_dir: Path,
    *,
    disk: Path | None,
    shared: bool = False,
    incoming: bool = False,
) -> list[str]:
    """QEMU's command line for a VM in ``run_dir``."""
    mem = f"{config.memory_mib}M"
    if config.memory_file is not None:
        backend = (
            f"memory-backend-file,id=mem,size={mem},mem-path={config.memory_file},"
            f"share={'on' if shared else 'off'}"
        )
    else:
        backend = f"memory-backend-ram,id=mem,size={mem}"
    if config.accelerator == "kvm":
        accel, cpu = ["-accel", "kvm"], "host"
    else:
        accel, cpu = ["-accel", f"tcg,tb-size={config.tb_size_mib}"], "max"
    argv = [
        config.qemu, "-M", "microvm,memory-backend=mem", *accel, "-cpu", cpu,
        "-m", mem, "-smp", str(config.vcpus),
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-object", backend,
        "-chardev", "stdio,id=ser,signal=off", "-serial", "chardev:ser",
        "-kernel", str(config.kernel), "-initrd", str(config.initramfs),
        "-append", kernel_cmdline(config),
        "-device", "virtio-serial-device",
        "-chardev", f"socket,id=ctl,path={run_dir / 'ctl.sock'},server=on,wait=off",
        "-device", f"virtserialport,chardev=ctl,name={CTL_PORT}",
        "-chardev", f"socket,id=data,path={run_dir / 'data.sock'},server=on,wait=off",
        "-device", f"virtserialport,chardev=data,name={DATA_PORT}",
        "-qmp", f"unix:{run_dir / 'qmp.sock'},server=on,wait=off",
        "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
    ]  # fmt: skip
    if disk is not None:
        argv += [
            "-drive", f"file={disk},if=none,id=root,format=qcow2,discard=unmap,detect-zeroes=unmap",
            "-device", "virtio-blk-device,drive=root",
        ]  # fmt: skip
    if incoming:
        argv += ["-incoming", "defer"]
    return argv


def check_id(vm_id: str) -> None:
    if not _ID.match(vm_id) or vm_id in (".", ".."):
        raise ValueError(f"bad VM id {vm_id!r}")


def _cgroup_dirs(config: VmConfig, vm_id: str) -> list[Path]:
    if config.cgroup_parent is None:
        return []
    return [CGROUP_ROOT / c / config.cgroup_parent / vm_id for c in ("memory", "cpu")]


def _make_cgroups(config: VmConfig, vm_id: str) -> list[Path]:
    dirs = _cgroup_dirs(config, vm_id)
    if not dirs:
        return []
    memory, cpu = dirs
    for d in dirs:
        if not d.parent.parent.is_dir():
            raise BackendUnavailable(f"no cgroup v1 controller at {d.parent.parent}")
        d.mkdir(parents=True, exist_ok=True)
    limit = (config.memory_mib + config.memory_overhead_mib) * MIB
    (memory / "memory.limit_in_bytes").write_text(str(limit))
    period = 100_000
    (cpu / "cpu.cfs_period_us").write_text(str(period))
    (cpu / "cpu.cfs_quota_us").write_text(str(period * config.vcpus))
    return dirs


def _kill_cgroup_tasks(dirs: list[Path]) -> None:
    for d in dirs:
        with contextlib.suppress(OSError):
            for pid in (d / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)


def _remove_cgroups(dirs: list[Path], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    for d in dirs:
        while d.exists():
            try:
                d.rmdir()
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    log.warning("microvm: cgroup %s still busy", d)
                    break
                _kill_cgroup_tasks([d])
                time.sleep(0.01)


def _user_ids(user: str | None) -> tuple[int, int, list[int]] | None:
    if user is None:
        return None
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise BackendUnavailable(
            f"no user {user} to run QEMU as (scripts/setup-microvm.sh creates it)"
        ) from None
    groups = [g for g in os.getgrouplist(user, pw.pw_gid) if g != pw.pw_gid]
    return pw.pw_uid, pw.pw_gid, groups


class _CappedLog:
    """Appends to ``path`` up to ``cap // 2`` bytes, then rotates it to ``path.1``: at
    most ``cap`` bytes on disk, the newest output kept."""

    def __init__(self, path: Path, cap: int) -> None:
        self.path = path
        self._half = max(4096, cap // 2)
        self._file = open(path, "ab")  # noqa: SIM115 (closed by close())
        self._size = self._file.tell()

    def write(self, data: bytes) -> None:
        while data:
            room = self._half - self._size
            if room <= 0:
                self._file.close()
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                self._file = open(self.path, "ab")  # noqa: SIM115
                self._size = 0
                continue
            self._file.write(data[:room])
            self._file.flush()
            self._size += min(room, len(data))
            data = data[room:]

    def close(self) -> None:
        self._file.close()


async def _pump(stream: asyncio.StreamReader, sink: _CappedLog) -> None:
    try:
        while chunk := await stream.read(65536):
            sink.write(chunk)
    finally:
        sink.close()


class Vm:
    """A running (or ended) QEMU; made by ``boot`` or ``restore``."""

    def __init__(
        self,
        vm_id: str,
        run_dir: Path,
        config: VmConfig,
        proc: asyncio.subprocess.Process,
        cgroups: list[Path],
    ) -> None:
        self.id = vm_id
        self.run_dir = run_dir
        self.config = config
        self.pid = proc.pid
        self._proc = proc
        self._cgroups = cgroups
        self._qmp: Qmp | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._ended: Ended | None = None
        self._removed = False
        #: the end of the guest's console output, kept when ``kill`` removes the run dir
        self.last_serial = ""

    @property
    def ctl_socket(self) -> Path:
        """The agent's control port (a Unix socket QEMU serves)."""
        return self.run_dir / "ctl.sock"

    @property
    def data_socket(self) -> Path:
        """The agent's data port."""
        return self.run_dir / "data.sock"

    @property
    def qmp_socket(self) -> Path:
        return self.run_dir / "qmp.sock"

    @property
    def serial_log(self) -> Path:
        """The guest's console (capped: the older half in serial.log.1)."""
        return self.run_dir / "serial.log"

    @property
    def qemu_log(self) -> Path:
        return self.run_dir / "qemu.log"

    @property
    def disk(self) -> Path:
        """The VM's overlay."""
        return self.run_dir / "disk.qcow2"

    @property
    def ended(self) -> Ended | None:
        """How QEMU ended, once ``wait`` has seen it; None while it runs."""
        if self._ended is None and self._proc.returncode is not None:
            return Ended(self._proc.returncode, self._shutdown_reason())
        return self._ended

    # -- making one ------------------------------------------------------------------

    @classmethod
    async def boot(
        cls,
        run_root: Path,
        vm_id: str,
        config: VmConfig,
        *,
        disk_base: Path | None,
        disk_size: int | None = None,
        shared: bool = False,
    ) -> Vm:
        """Cold boot: an overlay over ``disk_base`` (``disk_size`` bytes, at least the
        base's) and QEMU started; returns once QEMU's monitor answers (the guest is then
        booting: the agent's port answers when it is up). ``shared``: guest RAM in
        ``config.memory_file`` with share=on (a template to be saved)."""
        return await cls._start(
            run_root, vm_id, config, disk_base=disk_base, disk_size=disk_size, shared=shared
        )

    @classmethod
    async def restore(
        cls, run_root: Path, vm_id: str, template: Template, *, disk_size: int | None = None
    ) -> Vm:
        """A clone of ``template``, running on from where the template was saved. A
        ``disk_size`` larger than the template's grows the disk once the clone runs (the
        guest sees the new size; its file system grows when ``GROW_FS_ARGV`` runs in it)."""
        config = template.config
        if config.memory_file is None:
            raise ValueError("a template has its memory in a file")
        vm = await cls._start(
            run_root, vm_id, config, disk_base=template.disk, disk_size=None, incoming=True
        )
        try:
            await vm._incoming(template.state, ignore_shared=True)
            if disk_size is not None:
                await vm.resize_disk(disk_size)
        except BaseException:
            await vm.kill()
            raise
        return vm

    @classmethod
    async def template_of_snapshot(
        cls,
        run_root: Path,
        vm_id: str,
        config: VmConfig,
        *,
        state: Path,
        disk: Path,
        template_state: Path,
        template_disk: Path,
        timeout: float = 300.0,
    ) -> Template:
        """A template made of a VM's whole state (``save_snapshot``: ``state``, ``disk``):
        QEMU started on a new shared memory file (``config.memory_file``), the state loaded
        into it, then saved as a template (``save_template``) whose clones run on from the
        snapshot's moment."""
        if config.memory_file is None:
            raise ValueError("a template keeps its memory in a file (VmConfig.memory_file)")
        vm = await cls._start(
            run_root, vm_id, config, disk_base=disk, disk_size=None, shared=True, incoming=True
        )
        try:
            await vm._incoming(state, ignore_shared=False, timeout=timeout)
        except BaseException:
            await vm.kill()
            raise
        return await vm.save_template(template_state, template_disk)

    async def _incoming(self, state: Path, *, ignore_shared: bool, timeout: float = 60) -> None:
        """Load ``state`` into this VM (started with ``incoming``); returns once it runs.
        ``ignore_shared``: the state holds no RAM (a template's: it is in the memory file)."""
        qmp = await self._hand_state(
            os.open(state, os.O_RDONLY | os.O_CLOEXEC), ignore_shared=ignore_shared
        )
        await qmp.execute("migrate-incoming", {"uri": "fd:state"})
        deadline = time.monotonic() + timeout
        while True:
            status = await qmp.execute("query-status")
            if status.get("status") == "running":
                return
            if status.get("status") in ("inmigrate", "paused", "restore-vm", "prelaunch"):
                mig = await qmp.execute("query-migrate")
                if mig.get("status") == "failed":
                    raise VmError(f"VM {self.id}: restore failed: {mig.get('error-desc')}")
                if mig.get("status") == "completed" and status.get("status") == "paused":
                    # saved while stopped (a snapshot): QEMU keeps the source's run state
                    await qmp.execute("cont")
            else:
                raise VmError(f"VM {self.id}: restored into state {status.get('status')}")
            if time.monotonic() > deadline or self._proc.returncode is not None:
                raise VmError(f"VM {self.id}: restore did not finish")
            await asyncio.sleep(0.002)

    @classmethod
    async def _start(
        cls,
        run_root: Path,
        vm_id: str,
        config: VmConfig,
        *,
        disk_base: Path | None,
        disk_size: int | None,
        shared: bool = False,
        incoming: bool = False,
    ) -> Vm:
        check_id(vm_id)
        ids = _user_ids(config.user)
        run_dir = run_root / vm_id
        await asyncio.to_thread(_make_run_dir, run_dir)
        cgroups: list[Path] = []
        vm: Vm | None = None
        try:
            disk = await asyncio.to_thread(
                _prepare, run_dir, config, disk_base, disk_size, shared, ids
            )
            cgroups = await asyncio.to_thread(_make_cgroups, config, vm_id)
            argv = qemu_argv(config, run_dir, disk=disk, shared=shared, incoming=incoming)
            if ids is not None:
                uid, gid, groups = ids
                priv = [
                    "setpriv", f"--reuid={uid}", f"--regid={gid}",
                    f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups",
                    "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--",
                ]  # fmt: skip
                argv = priv + argv
            join = [str(d / "cgroup.procs") for d in cgroups]
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", _JOIN, "corral-vm-start", *join, "--", *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                cwd=run_dir,
            )  # fmt: skip
            vm = cls(vm_id, run_dir, config, proc, cgroups)
            (run_dir / "pid").write_text(f"{proc.pid}\n")
            assert proc.stdout is not None and proc.stderr is not None
            vm._tasks = [
                asyncio.create_task(
                    _pump(proc.stdout, _CappedLog(vm.serial_log, config.serial_max_bytes))
                ),
                asyncio.create_task(_pump(proc.stderr, _CappedLog(vm.qemu_log, 64 * 1024))),
            ]
            vm._qmp = await vm._connect_monitor()
            log.info(
                "microvm %s: QEMU %d started (%s%s)",
                vm_id,
                proc.pid,
                config.accelerator,
                ", restoring" if incoming else "",
            )
            return vm
        except BaseException:
            if vm is not None:
                await vm.kill()
            else:
                dirs = _cgroup_dirs(config, vm_id)
                _kill_cgroup_tasks(dirs)
                _remove_cgroups(dirs)
                shutil.rmtree(run_dir, ignore_errors=True)
            raise

    async def _connect_monitor(self) -> Qmp:
        deadline = time.monotonic() + 10
        while True:
            if self._proc.returncode is not None:
                break
            try:
                return await Qmp.connect(str(self.qmp_socket), timeout=1.0)
            except QmpError:
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.005)
        await self._stop_process()
        raise VmError(f"VM {self.id}: QEMU did not start: {self.qemu_log_tail()}")

    def _monitor(self) -> Qmp:
        if self._qmp is None or self._qmp.closed or self._proc.returncode is not None:
            raise SandboxNotRunning(f"VM {self.id} has ended")
        return self._qmp

    def qemu_log_tail(self, limit: int = 2000) -> str:
        try:
            return self.qemu_log.read_bytes()[-limit:].decode(errors="replace").strip()
        except OSError:
            return ""

    def serial_tail(self, limit: int = 4000) -> str:
        try:
            return self.serial_log.read_bytes()[-limit:].decode(errors="replace")
        except OSError:
            return ""

    # -- controls --------------------------------------------------------------------

    async def execute(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        """A QMP command (for what the methods here do not cover)."""
        return await self._monitor().execute(command, arguments)

    async def pause(self) -> None:
        await self._monitor().execute("stop")

    async def resume(self) -> None:
        await self._monitor().execute("cont")

    async def resize_disk(self, size_bytes: int) -> None:
        """Grow the VM's disk to ``size_bytes`` while it runs (never shrinks it: a smaller
        size is refused); the guest kernel sees the new size at once, its file system grows
        when the guest runs ``GROW_FS_ARGV``."""
        qmp = self._monitor()
        blocks = await qmp.execute("query-block")
        current = next(
            (
                int(b["inserted"]["image"]["virtual-size"])
                for b in blocks
                if b.get("device") == "root" and "inserted" in b
            ),
            None,
        )
        if current is None:
            raise VmError(f"VM {self.id} has no disk")
        if size_bytes < current:
            raise Unsupported(f"a disk cannot shrink ({current} to {size_bytes} bytes)")
        if size_bytes > current:
            await qmp.execute("block_resize", {"device": "root", "size": size_bytes})

    async def status(self) -> str:
        """QEMU's run state ("running", "paused", …)."""
        return str((await self._monitor().execute("query-status")).get("status"))

    async def save_template(self, state: Path, disk: Path, timeout: float = 120.0) -> Template:
        """Save this VM (booted ``shared=True`` with a memory file) as a template: its
        device state to ``state`` (the RAM stays in the memory file: x-ignore-shared), its
        disk moved to ``disk`` (read-only: clones' overlays stand on it); QEMU then quits
        and the run directory is removed. The guest is not stopped first, so clones run
        on from this moment by themselves."""
        qmp = self._monitor()
        if self.config.memory_file is None:
            raise ValueError("a template keeps its memory in a file (VmConfig.memory_file)")
        tmp = state.with_name(f".{state.name}.{os.getpid()}.tmp")
        try:
            await self._migrate_out(tmp, ignore_shared=True, timeout=timeout)
            await qmp.execute("quit")
            async with asyncio.timeout(10):
                await self._proc.wait()
            os.chmod(tmp, 0o444)
            os.replace(tmp, state)
            disk.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.disk, disk)
            os.chown(disk, 0, 0)
            os.chmod(disk, 0o444)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            await self.kill()
            raise
        await self.kill()
        log.info("microvm %s: saved as a template (%s)", self.id, state)
        return Template(config=self.config, state=state, disk=disk)

    async def save_snapshot(self, state: Path, disk: Path, timeout: float = 300.0) -> None:
        """The VM's whole state now, its RAM included, to ``state``, and a copy of its
        disk (an overlay over its template's, read-only) to ``disk``: the guest is stopped
        meanwhile and runs on afterwards if it ran (``template_of_snapshot`` makes a
        template of them)."""
        qmp = self._monitor()
        running = await self.status() == "running"
        await qmp.execute("stop")
        try:
            await self._migrate_out(state, ignore_shared=False, timeout=timeout)
            await asyncio.to_thread(_copy_disk, self.disk, disk)
        except BaseException:
            for path in (state, disk):
                with contextlib.suppress(OSError):
                    path.unlink()
            raise
        finally:
            if running and self._proc.returncode is None:
                await qmp.execute("cont")  # from postmigrate: its disk is taken back too

    async def _hand_state(self, fd: int, *, ignore_shared: bool) -> Qmp:
        """Give QEMU the state file ``fd`` (closed here) as ``fd:state``, with
        ``x-ignore-shared`` set as asked; the monitor, for the migration command."""
        try:
            qmp = self._monitor()
            await qmp.execute(
                "migrate-set-capabilities",
                {"capabilities": [{"capability": "x-ignore-shared", "state": ignore_shared}]},
            )
            await qmp.execute("getfd", {"fdname": "state"}, fds=[fd])
        finally:
            os.close(fd)
        return qmp

    async def _migrate_out(self, path: Path, *, ignore_shared: bool, timeout: float) -> None:
        """Write the VM's state to a new ``path`` (only its device state when
        ``ignore_shared`` and its RAM is in a shared file)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        qmp = await self._hand_state(fd, ignore_shared=ignore_shared)
        await qmp.execute("migrate", {"uri": "fd:state"})
        deadline = time.monotonic() + timeout
        while True:
            mig = await qmp.execute("query-migrate")
            if mig.get("status") == "completed":
                return
            if mig.get("status") in ("failed", "cancelled"):
                raise VmError(f"VM {self.id}: saving failed: {mig.get('error-desc')}")
            if time.monotonic() > deadline:
                await qmp.execute("migrate_cancel")
                raise VmError(f"VM {self.id}: saving did not finish in {timeout} s")
            await asyncio.sleep(0.002)

    # -- ending ----------------------------------------------------------------------

    def _shutdown_reason(self) -> str | None:
        if self._qmp is None:
            return None
        for event in reversed(self._qmp.events):
            if event.get("event") == "SHUTDOWN":
                data = event.get("data")
                if isinstance(data, dict):
                    return str(data.get("reason"))
        return None

    async def _drain_monitor(self) -> None:
        """Read what QEMU said before it ended (its SHUTDOWN event) into the queue."""
        if self._qmp is None or self._qmp.closed:
            return
        with contextlib.suppress(QmpError, TimeoutError, OSError):
            event = await self._qmp.wait_event("SHUTDOWN", timeout=0.2)
            self._qmp.events.append(event)

    async def wait(self) -> Ended:
        """Until QEMU ends (a guest reboot or panic ends it: -no-reboot, panic=-1)."""
        returncode = await self._proc.wait()
        if self._ended is None:
            await self._drain_monitor()
            self._ended = Ended(returncode, self._shutdown_reason())
        return self._ended

    async def _stop_process(self) -> None:
        if self._proc.returncode is None:
            # os.kill, not Popen.kill: that polls first and may reap QEMU under asyncio's
            # child watcher (which would then report 255). Unreaped, the pid is still ours.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signal.SIGKILL)
        _kill_cgroup_tasks(self._cgroups)
        await self._proc.wait()
        for task in self._tasks:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await task
            task.cancel()

    async def kill(self) -> Ended:
        """SIGKILL QEMU (if it runs), then remove its run directory and cgroups."""
        if self._ended is None and self._proc.returncode is not None:
            await self.wait()
        await self._stop_process()
        if self._ended is None:
            self._ended = Ended(self._proc.returncode, None)
        if self._qmp is not None:
            self._qmp.close()
        if not self._removed:
            self._removed = True
            self.last_serial = self.serial_tail()
            await asyncio.to_thread(_remove_cgroups, self._cgroups)
            await asyncio.to_thread(shutil.rmtree, self.run_dir, True)
        return self._ended


def _make_run_dir(run_dir: Path) -> None:
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(mode=0o700)  # FileExistsError: the id is in use


def _prepare(
    run_dir: Path,
    config: VmConfig,
    disk_base: Path | None,
    disk_size: int | None,
    shared: bool,
    ids: tuple[int, int, list[int]] | None,
) -> Path | None:
    """The VM's overlay (when it has a disk) and memory file, the VM user's."""
    disk = None
    if disk_base is not None:
        disk = make_overlay(disk_base, run_dir / "disk.qcow2", disk_size)
    if config.memory_file is not None and shared:
        _prepare_memory_file(config.memory_file, config.memory_mib * MIB, ids)
    if ids is not None:
        for path in [run_dir, *([disk] if disk else [])]:
            os.chown(path, ids[0], ids[1])
    return disk


def _copy_disk(source: Path, dest: Path) -> None:
    """A copy of a (stopped) VM's overlay, holes kept, read-only: a snapshot's disk (its
    backing file stays the template's disk, named by its absolute path)."""
    subprocess.run(
        ["cp", "--sparse=always", "--", str(source), str(dest)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    os.chown(dest, 0, 0)
    os.chmod(dest, 0o444)


def _prepare_memory_file(path: Path, size: int, ids: tuple[int, int, list[int]] | None) -> None:
    """The template's RAM file, ``size`` bytes (sparse), the VM user's (QEMU opens it
    read-write)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
        if ids is not None:
            os.fchown(fd, ids[0], ids[1])
    finally:
        os.close(fd)


# -- leftovers of an earlier node process -------------------------------------------------


def alias(run_root: Path, name: str, vm_id: str) -> None:
    """Let the VM ``vm_id`` answer to ``name`` too (a claimed warm VM to its sandbox's id):
    a symlink in ``run_root``, which ``leftovers`` and ``reap`` follow."""
    check_id(name)
    check_id(vm_id)
    (run_root / name).symlink_to(vm_id)


def unalias(run_root: Path, name: str) -> None:
    path = run_root / name
    if path.is_symlink():
        path.unlink()


def _aliased(run_root: Path, name: str) -> str | None:
    """The VM id ``name`` is an alias of, or None."""
    path = run_root / name
    if not path.is_symlink():
        return None
    target = os.readlink(path)
    return target if _ID.match(target) else None


def leftovers(run_root: Path) -> list[str]:
    """The ids of the VMs under ``run_root`` (a node that starts finds the ones its
    previous process left: ``reap`` each): a VM with an alias by its alias (the id its
    sandbox is known by), every other by its run directory's name."""
    if not run_root.is_dir():
        return []
    names = [p.name for p in run_root.iterdir() if _ID.match(p.name)]
    aliases = {name: _aliased(run_root, name) for name in names}
    aliased = {vm for vm in aliases.values() if vm is not None}
    return sorted(
        name
        for name in names
        if (aliases[name] is not None or (run_root / name).is_dir()) and name not in aliased
    )


def reap(run_root: Path, vm_id: str, cgroup_parent: str | None = "corral-vm") -> None:
    """Kill a leftover VM's QEMU (its pid file's process when it is that VM's QEMU, and
    every task of its cgroups), wait for it to go, remove its cgroups and run directory.
    Blocking; succeeds when nothing is left. ``vm_id`` may be an alias (``alias``)."""
    check_id(vm_id)
    target = _aliased(run_root, vm_id)
    if target is not None:
        reap(run_root, target, cgroup_parent)
        unalias(run_root, vm_id)
        return
    run_dir = run_root / vm_id
    cgroups = (
        []
        if cgroup_parent is None
        else [CGROUP_ROOT / c / cgroup_parent / vm_id for c in ("memory", "cpu")]
    )
    if not run_dir.exists() and not any(d.exists() for d in cgroups):
        return
    pid = _leftover_pid(run_dir)
    if pid is not None:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            pidfd = None
        if pidfd is not None:
            try:
                if _is_vm_process(pid, run_dir):
                    os.kill(pid, signal.SIGKILL)
                    _wait_pidfd(pidfd, 10.0)
            finally:
                os.close(pidfd)
    _kill_cgroup_tasks(cgroups)
    _remove_cgroups(cgroups)
    shutil.rmtree(run_dir, ignore_errors=True)
    log.info("microvm %s: reaped a leftover VM (pid %s)", vm_id, pid)


def _leftover_pid(run_dir: Path) -> int | None:
    try:
        text = (run_dir / "pid").read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _is_vm_process(pid: int, run_dir: Path) -> bool:
    """The process ``pid`` is QEMU (or its start wrapper) of the VM in ``run_dir``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(run_dir / "qmp.sock").encode() in cmdline


def _wait_pidfd(pidfd: int, timeout: float) -> None:
    import select

    select.select([pidfd], [], [], timeout)


# -- the accelerator ------------------------------------------------------------------

_probed: dict[str, Accel] = {}
_probe_lock: asyncio.Lock | None = None


def kvm_opens(path: str = "/dev/kvm") -> bool:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    return True


async def accelerator(
    artifacts: Artifacts,
    run_root: Path,
    force: Literal["auto", "kvm", "tcg"] = "auto",
    *,
    user: str | None = VM_USER,
) -> Accel:
    """The accelerator VMs use: ``force`` unless "auto"; else "kvm" when /dev/kvm opens
    and a probe boot under KVM reaches its init (a KVM here may be unable to run a stock
    kernel: a PVM host), else "tcg". The probe runs once per node process."""
    global _probe_lock
    if force != "auto":
        return force
    if not kvm_opens():
        return "tcg"
    if _probe_lock is None:
        _probe_lock = asyncio.Lock()
    async with _probe_lock:
        key = "host"  # what the host's KVM can do: one probe per process, whatever the root
        if key not in _probed:
            ok = await probe_kvm(artifacts, run_root, user=user)
            _probed[key] = "kvm" if ok else "tcg"
            log.info("microvm: accelerator %s (KVM probe %s)", _probed[key], ok)
        return _probed[key]


async def probe_kvm(
    artifacts: Artifacts,
    run_root: Path,
    *,
    user: str | None = VM_USER,
    timeout: float = KVM_PROBE_TIMEOUT_S,
    accel: Accel = "kvm",
) -> bool:
    """Whether a guest boots under KVM (``accel``) here: the guest kernel with an
    initramfs whose init prints a mark and reboots, within ``timeout``."""
    kernel = await asyncio.to_thread(artifacts.kernel)
    initrd = await asyncio.to_thread(artifacts.initramfs, Path("/bin/busybox"), init=PROBE_INIT)
    config = VmConfig(
        kernel=kernel, initramfs=initrd, memory_mib=128, accelerator=accel, user=user,
        cgroup_parent=None,
    )  # fmt: skip
    vm_id = f"kvm-probe-{os.getpid()}"
    await asyncio.to_thread(reap, run_root, vm_id, None)
    try:
        vm = await Vm.boot(run_root, vm_id, config, disk_base=None)
    except SandboxError as e:
        log.info("microvm: KVM probe: QEMU did not start: %s", e)
        return False
    try:
        async with asyncio.timeout(timeout):
            await vm.wait()
    except TimeoutError:
        pass
    finally:
        await vm.kill()
    return PROBE_MARK in vm.last_serial
