"""Container sandboxes on crun (runc as a fallback): the ``crun`` sandbox backend.

A sandbox on disk (``<data_dir>/sandboxes/<id>/``, private to the node): ``layer/``, a
tmpfs of ``disk_mb`` holding the overlay's ``upper`` and ``work`` dirs (the writable
layer: its size is the sandbox's disk, its pages are charged to whoever writes them);
``config.json``; ``sandbox.json`` (what the node keeps of it: env, its id range).

Each sandbox has a user namespace of its own (``crun.uidranges``: a host id range no
other sandbox on the host holds). Its root file system, the overlay of its layer on the
image's read-only root (and the snapshot layers it starts from), is mounted in its slot's
directory (``UidRanges.rootfs``), which only that range's root can enter. The read-only
layers are stored with the ids their files have inside (an image's, a snapshot's) and
given to overlayfs as idmapped, detached trees (``crun.mounts.idmapped_tree``): one copy
serves every sandbox, each seeing it owned by its own range. The overlay's options name
those trees and the layer by descriptor, so the sandbox's ``/proc/self/mountinfo`` shows
no host path.

The runtime keeps its state under ``<data_dir>/sandboxes/.state`` (``crun --root``),
which is how a restarted node finds the sandboxes it left running (``start``).
``destroy`` kills the container, deletes it (its cgroups go with it), and unmounts and
removes the rest, its id range last; every step is safe to repeat, so a half-made or
half-destroyed sandbox is finished off by the next. All sandboxes sit under one parent
cgroup whose memory limit (``memory_limit_mb``) bounds them together, so many that each
keep within their own limit can never exhaust the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import time
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import Any

from node import threadspawn
from node.children import communicate
from node.sandboxes import dns, rooted
from node.sandboxes.base import (
    BackendUnavailable,
    DirWatch,
    DiskFull,
    FileStream,
    RootImage,
    SandboxBackend,
    SandboxError,
    SandboxNotFound,
    SandboxNotRunning,
    SandboxPathError,
    SandboxUnresponsive,
    SnapshotFiles,
    Unsupported,
    Usage,
)
from node.sandboxes.crun import bundle, freezer, mounts, spawn
from node.sandboxes.crun.fileops import InitFiles
from node.sandboxes.crun.lxcfs import Lxcfs
from node.sandboxes.crun.process import Child, CrunProcess
from node.sandboxes.crun.uidranges import IdRange, UidRanges
from node.sandboxes.crun.userns import UserNamespaces
from node.sandboxes.inotify import InotifyWatch
from node.sandboxes.network import Attachment, Network
from node.sandboxes.rooted import ROOT, Account
from wire.sandboxes import (
    MAX_PAGE,
    EntryPage,
    ExecRequest,
    FileEntry,
    Phases,
    SandboxSpec,
    parse_destination,
)

log = logging.getLogger(__name__)

CGROUP_PARENT = "corral-sandboxes"
#: built by scripts/setup-sandboxes.sh
DEFAULT_INIT = Path(__file__).resolve().parents[1] / "guest" / "bin" / "corral-init"
CGROUP_V1 = Path("/sys/fs/cgroup")
PID_FILE_WAIT_S = 5.0
#: a sandbox's place on the node's sandbox network (``node.sandboxes.network``)
NETWORK_FILE = "network.json"
#: where sandboxes bind-mount ``corral-init`` from: a tmpfs of the host's own
INIT_DIR = Path("/run/corral/init")


class RuntimeCommandError(SandboxError):
    pass


class CrunBackend(SandboxBackend):
    name = "crun"

    def __init__(
        self,
        data_dir: Path,
        *,
        runtime: str = "crun",
        init_binary: Path | None = None,
        cgroup_root: Path = CGROUP_V1,
        network: Network | None = None,
        uid_ranges: UidRanges | None = None,
        user_namespaces: bool = True,
        lxcfs: Lxcfs | None = None,
        memory_limit_mb: int | None = None,
        cgroup_parent: str = CGROUP_PARENT,
    ) -> None:
        """``uid_ranges``: where sandboxes' host id ranges come from (the host-wide
        registry by default); ``user_namespaces=False`` runs sandboxes without one, root
        inside then being host root (only for kernels without idmapped mounts);
        ``lxcfs``: the sandboxes' own /proc figures (the host's LXCFS by default);
        ``memory_limit_mb``: the memory of all sandboxes together (None: unbounded), on
        their parent cgroup ``cgroup_parent``."""
        self.root = (data_dir / "sandboxes").resolve()
        self.state_dir = self.root / ".state"
        self.runtime = runtime
        self.init_binary = init_binary or DEFAULT_INIT
        self.cgroup_root = cgroup_root
        self.network = network
        self.ranges = (uid_ranges or UidRanges()) if user_namespaces else None
        self._namespaces = UserNamespaces()
        self.lxcfs = lxcfs or Lxcfs()
        self.memory_limit_mb = memory_limit_mb
        self.cgroup_parent = cgroup_parent
        self._binary: str | None = None
        self._init_copy = self.init_binary  #: the tmpfs copy, once started
        self._processes: dict[str, set[CrunProcess]] = {}
        self._meta: dict[str, dict[str, Any]] = {}

    # --- set-up -----------------------------------------------------------------------
    async def start(self) -> list[str]:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root, 0o700)
        self.state_dir.mkdir(exist_ok=True, mode=0o700)
        if not self.init_binary.exists():
            raise BackendUnavailable(
                f"{self.init_binary} is missing: run scripts/setup-sandboxes.sh"
            )
        self._binary = self._usable_runtime()
        await asyncio.to_thread(self._install_init)
        await asyncio.to_thread(self._bound_all)
        await self.lxcfs.ensure()
        if self.ranges is not None:
            await asyncio.to_thread(self.ranges.reclaim)
        aliases = {
            os.readlink(link): link.name for link in self.root.iterdir() if link.is_symlink()
        }
        listed = sorted(await self._listed())
        if self.network is not None:
            held = [a for cid in listed if (a := _attachment(self.root / cid)) is not None]
            await self.network.adopt(held)
        return [aliases.get(cid, cid) for cid in listed]

    def _usable_runtime(self) -> str:
        """The runtime's binary; crun that cannot run here (not installed, or a hybrid
        cgroup layout whose hugetlb controller cannot be mounted) falls back to runc,
        and says so."""
        binary = shutil.which(self.runtime)
        problem = None if binary else f"{self.runtime} is not installed"
        if binary and self.runtime == "crun":
            try:
                ensure_hugetlb_mount(self.cgroup_root)
            except BackendUnavailable as exc:
                problem = str(exc)
        if problem is None and binary is not None:
            return binary
        fallback = shutil.which("runc") if self.runtime == "crun" else None
        if fallback is None:
            raise BackendUnavailable(f"{problem}: run scripts/setup-sandboxes.sh")
        log.warning("%s: container sandboxes run on runc (%s) instead", problem, fallback)
        self.runtime = "runc"
        return fallback

    def _install_init(self) -> None:
        """The copy of ``corral-init`` sandboxes bind-mount as their PID 1: on a small
        tmpfs of the host's own (``INIT_DIR``, one for every node on the host, mounted
        once and never unmounted, so a node that crashes leaves nothing under its data dir
        and sandboxes it left running keep theirs), named by its content, so an upgraded
        binary never replaces the one running sandboxes use. A sandbox's mountinfo then
        names no host path, only that file on a tmpfs."""
        digest = hashlib.sha256(self.init_binary.read_bytes()).hexdigest()[:16]
        INIT_DIR.mkdir(parents=True, exist_ok=True, mode=0o755)
        lock = os.open(f"{INIT_DIR}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not mounts.is_mount(INIT_DIR):
                flags = mounts.MS_NOSUID | mounts.MS_NODEV
                mounts.mount("corral-init", INIT_DIR, "tmpfs", "size=64m,mode=0755", flags)
            target = INIT_DIR / f"corral-init-{digest}"
            if not target.exists():
                staging = target.with_suffix(".tmp")
                shutil.copyfile(self.init_binary, staging)
                os.chmod(staging, 0o555)
                staging.rename(target)
        finally:
            os.close(lock)
        self._init_copy = target

    def _bound_all(self) -> None:
        """The memory limit of all sandboxes together, on their parent cgroup."""
        if self.memory_limit_mb is None or not (self.cgroup_root / "memory").is_dir():
            return
        group = self.cgroup_root / "memory" / self.cgroup_parent
        group.mkdir(exist_ok=True)
        limit = str(self.memory_limit_mb << 20)
        names = ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
        if (group / "memory.memsw.limit_in_bytes").exists():
            current = int((group / "memory.memsw.limit_in_bytes").read_text())
            if int(limit) > current:
                names.reverse()  # memory+swap must stay at or above memory
        for name in names:
            if (group / name).exists():
                (group / name).write_text(limit)
        log.info("all sandboxes together are limited to %d MiB", self.memory_limit_mb)

    async def close(self) -> None:
        for processes in self._processes.values():
            for process in list(processes):
                await process.kill()
        self._processes.clear()
        if self.network is not None:
            await self.network.close()
        self._namespaces.close()
        self.lxcfs.close()  # (LXCFS itself serves on: it is the host's, not the node's)

    # --- lifecycle ----------------------------------------------------------------------
    def _cid(self, sandbox_id: str) -> str:
        """The runtime's container id of a sandbox: its own id, or, for a sandbox claimed
        from the warm pool, the pool container's (``<root>/<sandbox id>`` is then a
        symlink to that container's directory)."""
        if not sandbox_id.replace("-", "").replace("_", "").isalnum():
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
        alias = self.root / sandbox_id
        if alias.is_symlink():
            return os.readlink(alias)
        return sandbox_id

    def _dir(self, sandbox_id: str) -> Path:
        return self.root / self._cid(sandbox_id)

    async def create(self, spec: SandboxSpec, image: RootImage) -> Phases:
        started = time.monotonic()
        directory = self._dir(spec.sandbox_id)
        try:
            ids = await asyncio.to_thread(self._make_dir, directory)
            userns = None if ids is None else await self._namespaces.get(ids.mapping())
            await asyncio.to_thread(self._prepare, spec, image, directory, ids, userns)
            prepared = time.monotonic()
            with spawn.listener(directory / spawn.SOCKET_NAME) as listening:
                await self._runtime(
                    "run",
                    "--detach",
                    "--preserve-fds",
                    "1",
                    "--bundle",
                    str(directory),
                    spec.sandbox_id,
                    stdio=False,
                    fd3=listening.fileno(),
                )
            if not spec.network.isolated:
                await self._attach(spec, directory)
        except BaseException:
            await asyncio.shield(self.destroy(spec.sandbox_id))
            raise
        done = time.monotonic()
        return Phases(setup_ms=(prepared - started) * 1000, start_ms=(done - prepared) * 1000)

    def _make_dir(self, directory: Path) -> IdRange | None:
        """The sandbox's directory, and the id range it now holds (None: no user
        namespace on this node)."""
        directory.mkdir(mode=0o700)
        return None if self.ranges is None else self.ranges.allocate(directory)

    def _prepare(
        self,
        spec: SandboxSpec,
        image: RootImage,
        directory: Path,
        ids: IdRange | None,
        userns: int | None,
    ) -> None:
        layer = directory / "layer"
        rootfs = (
            directory / "rootfs" if ids is None or self.ranges is None else self.ranges.rootfs(ids)
        )
        layer.mkdir()
        rootfs.mkdir(exist_ok=True)
        mounts.mount(
            "corral-layer",
            layer,
            "tmpfs",
            f"size={spec.disk_mb}m,mode=0700",
            mounts.MS_NOSUID | mounts.MS_NODEV,
        )
        (layer / "upper").mkdir()
        (layer / "work").mkdir()
        os.chmod(layer / "upper", 0o755)
        if ids is not None:
            os.chown(layer / "upper", ids.first, ids.first)  # the root dir: root's inside
        _write_offline_resolv_conf(layer / "upper", (*image.layers, image.rootfs), ids)
        held: list[int] = []
        try:
            lowers = (*image.layers, image.rootfs)
            if userns is None:
                held += [os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for p in lowers]
            else:
                held += [mounts.idmapped_tree(p, userns) for p in lowers]
            upper, work = (
                os.open(layer / name, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                for name in ("upper", "work")
            )
            held += [upper, work]
            lower = ":".join(mounts.fd_path(fd) for fd in held[: len(lowers)])
            options = (
                f"lowerdir={lower},upperdir={mounts.fd_path(upper)},workdir={mounts.fd_path(work)}"
            )
            mounts.mount("corral-rootfs", rootfs, "overlay", options)
        finally:
            for fd in held:
                os.close(fd)
        config = bundle.config(
            spec,
            rootfs=rootfs,
            init_binary=self._init_copy,
            cgroup_parent=self.cgroup_parent,
            ids=ids,
            views=self.lxcfs.views(),
        )
        _write_private(directory / "config.json", json.dumps(config))
        meta: dict[str, Any] = {
            "digest": image.digest,
            "env": {**dict(image.env), **spec.env},
            "users": {a.name: [a.uid, a.gid, a.home] for a in image_users(image).values()},
            "rootfs": str(rootfs),
        }
        if spec.workdir is not None:
            meta["workdir"] = spec.workdir
        if ids is not None:
            meta["ids"] = {"slot": ids.slot, "first": ids.first, "size": ids.size}
        _write_private(directory / "sandbox.json", json.dumps(meta))

    async def claim(self, warm_id: str, spec: SandboxSpec) -> None:
        directory = self.root / warm_id
        if not (directory / "config.json").exists():
            raise SandboxNotFound(f"no warm sandbox {warm_id}")
        await asyncio.to_thread(self._reshape, warm_id, directory, spec)
        (self.root / spec.sandbox_id).symlink_to(warm_id)
        try:
            await asyncio.to_thread(self._thaw, warm_id)
            if not spec.network.isolated:
                await self._attach(spec, directory)
        except BaseException:
            (self.root / spec.sandbox_id).unlink(missing_ok=True)
            raise

    async def _attach(self, spec: SandboxSpec, directory: Path) -> None:
        """Give a sandbox the network its spec allows (before any command runs in it)."""
        if self.network is None:
            raise BackendUnavailable("this node gives sandboxes no network (sandbox_network_cidr)")
        state = await self._runtime_json("state", self._cid(spec.sandbox_id))
        pid = int(state["pid"]) if isinstance(state, dict) and state.get("pid") else 0
        if pid <= 0:
            raise SandboxNotRunning(f"sandbox {spec.sandbox_id} has no init process")
        attachment = await self.network.attach(spec.sandbox_id, pid, spec.network)
        try:
            (directory / NETWORK_FILE).write_text(attachment.to_json())
            if attachment.hosts:
                await self._add_hosts(spec.sandbox_id, attachment.hosts)
            files = InitFiles(self._dir(spec.sandbox_id) / spawn.SOCKET_NAME, spec.sandbox_id)
            conf = dns.resolv_conf(attachment.host_ip, _resolvers_allowed(spec))
            await files.write("/etc/resolv.conf", ROOT, _once(conf.encode()), mode=0o644)
        except BaseException:
            await asyncio.shield(self.network.detach(attachment))
            raise

    def _thaw(self, cid: str) -> None:
        """Thaw through the v1 freezer directly (what ``crun resume`` writes, without a
        process start on the claim's path)."""
        state = self.cgroup_root / "freezer" / self.cgroup_parent / cid / "freezer.state"
        if not state.exists():
            raise SandboxNotRunning(f"warm sandbox {cid} has no freezer group")
        freezer.thaw(state)

    def _reshape(self, cid: str, directory: Path, spec: SandboxSpec) -> None:
        """The warm sandbox's limits, disk size and env become the spec's."""
        memory = spec.memory_mb << 20
        group = self.cgroup_root / "memory" / self.cgroup_parent / cid
        current = int((group / "memory.limit_in_bytes").read_text())
        order = ["memory.memsw.limit_in_bytes", "memory.limit_in_bytes"]
        if memory < current:
            order.reverse()  # the memory limit must stay at or below memory+swap
        for name in order:
            if (group / name).exists():
                (group / name).write_text(str(memory))
        pids = self.cgroup_root / "pids" / self.cgroup_parent / cid / "pids.max"
        pids.write_text(str(spec.pids))
        quota = self.cgroup_root / "cpu" / self.cgroup_parent / cid / "cpu.cfs_quota_us"
        if quota.exists():
            quota.write_text(str(int(spec.cpu * bundle.PERIOD_US)))
        mounts.mount(
            "corral-layer",
            directory / "layer",
            "tmpfs",
            f"size={spec.disk_mb}m",
            mounts.MS_REMOUNT | mounts.MS_NOSUID | mounts.MS_NODEV,
        )
        meta = json.loads((directory / "sandbox.json").read_text())
        meta["env"] = {**meta.get("env", {}), **spec.env}
        if spec.workdir is not None:
            meta["workdir"] = spec.workdir
        _write_private(directory / "sandbox.json", json.dumps(meta))

    async def destroy(self, sandbox_id: str) -> None:
        cid = self._cid(sandbox_id)
        directory = self.root / cid
        self._meta.pop(sandbox_id, None)
        for process in list(self._processes.pop(sandbox_id, ())):
            await process.kill()
        try:
            await self._runtime("delete", "--force", cid)
        except RuntimeCommandError as exc:
            # "no such container" is a sandbox already gone (or never started); one the
            # runtime still lists keeps its mounts and files, and the caller is told
            try:
                still_there = cid in await self._listed()
            except RuntimeCommandError:
                still_there = True  # the runtime cannot say: keep everything
            if still_there:
                raise SandboxError(f"sandbox {sandbox_id} could not be deleted: {exc}") from exc
        attachment = _attachment(directory)
        if attachment is not None and self.network is not None:
            await self.network.detach(attachment)
        await asyncio.to_thread(self._release, directory)
        if cid != sandbox_id:
            (self.root / sandbox_id).unlink(missing_ok=True)

    async def _listed(self) -> set[str]:
        """The container ids the runtime lists."""
        listed = await self._runtime_json("list", "--format", "json")
        return {str(entry["id"]) for entry in listed or []}

    def _release(self, directory: Path) -> None:
        ids = self._ids_of(directory)
        rootfs = directory / "rootfs"
        if ids is not None and self.ranges is not None:
            rootfs = self.ranges.rootfs(ids)
        for mount_point in (rootfs, directory / "layer"):
            mounts.unmount(mount_point)
        if ids is not None and self.ranges is not None:
            self.ranges.release(directory, ids.slot)
        shutil.rmtree(directory, ignore_errors=True)

    def _ids_of(self, directory: Path) -> IdRange | None:
        """The id range the sandbox in ``directory`` holds (its record, else the
        registry: a create that failed before writing its record)."""
        if self.ranges is None:
            return None
        try:
            ids = json.loads((directory / "sandbox.json").read_text()).get("ids")
        except (OSError, ValueError):
            return self.ranges.held(directory)
        return None if ids is None else self.ranges.range(int(ids["slot"]))

    async def pause(self, sandbox_id: str) -> None:
        await asyncio.to_thread(self._freezer_of, sandbox_id)
        await self._freeze(sandbox_id)

    async def _freeze(self, sandbox_id: str) -> None:
        """Freeze through the v1 freezer directly (all ``crun pause`` does on v1, and the
        runtime's ``state`` then reads "paused" from the same file), then wait until the
        kernel has stopped every task in the sandbox (``freezer.settle_frozen``): a
        write only starts the freeze. No runtime process: a warm sandbox's refill pays
        for none (two, ``state`` and ``pause``, were a third of its cost)."""
        state = self._cgroup("freezer", sandbox_id) / "freezer.state"
        freezer.freeze(state)
        await freezer.settle_frozen(state)

    async def resume(self, sandbox_id: str) -> None:
        freezer.thaw(await asyncio.to_thread(self._freezer_of, sandbox_id))

    def _freezer_of(self, sandbox_id: str) -> Path:
        """The sandbox's ``freezer.state``: SandboxNotFound without its files,
        SandboxNotRunning without its group (the runtime deleted it, or never made it)."""
        if not (self._dir(sandbox_id) / "config.json").exists():
            raise SandboxNotFound(f"no sandbox {sandbox_id}")
        state = self._cgroup("freezer", sandbox_id) / "freezer.state"
        if not state.exists():
            raise SandboxNotRunning(f"sandbox {sandbox_id} is not running (no freezer group)")
        return state

    # --- commands ---------------------------------------------------------------------
    def _runnable(self, sandbox_id: str) -> dict[str, Any]:
        """The sandbox's saved settings, once the kernel's freezer says it can run
        commands and file calls (no runtime command on the hot path): a paused sandbox is
        refused at once, never waited for."""
        directory = self._dir(sandbox_id)
        freezer = self._cgroup("freezer", sandbox_id) / "freezer.state"
        try:
            state = freezer.read_text().strip()
        except OSError as exc:
            if not (directory / "config.json").exists():
                raise SandboxNotFound(f"no sandbox {sandbox_id}") from None
            # its files are here but its freezer group cannot be read: say what was found
            # (the tenant's answer names no host path)
            log.warning(
                "sandbox=%s: exec refused, its freezer group cannot be read (%s; group %s)",
                sandbox_id,
                exc,
                "present" if freezer.parent.is_dir() else "absent",
            )
            raise SandboxNotRunning(
                f"sandbox {sandbox_id} is not running (its cgroup cannot be read)"
            ) from None
        if state != "THAWED":
            raise SandboxNotRunning(f"sandbox {sandbox_id} is paused")
        meta = self._meta.get(sandbox_id)
        if meta is None:
            meta = self._meta[sandbox_id] = json.loads((directory / "sandbox.json").read_text())
        return meta

    async def _account(self, sandbox_id: str, meta: dict[str, Any], user: str) -> Account:
        """Who ``user`` is in the sandbox: ``root``, a name, ``uid`` or ``uid:gid``. Names
        are looked up in the image's /etc/passwd (recorded at creation: the sandbox cannot
        change what they mean), then in the sandbox's own (users it added, read by its
        init as root); a number needs no account."""
        image = {
            name: Account(name, int(ids[0]), int(ids[1]), str(ids[2]))
            for name, ids in meta.get("users", {}).items()
        }
        found = rooted.find(user, image)
        if found is not None:
            return found
        ids = rooted.numeric(user)
        if ids is None or ids[1] is None:
            spawner = self._dir(sandbox_id) / spawn.SOCKET_NAME
            live: dict[str, Account] = {}
            if spawner.exists():
                files = InitFiles(spawner, sandbox_id)
                with contextlib.suppress(SandboxPathError):
                    text = await files.read_small(
                        "/etc/passwd", ROOT, max_bytes=rooted.MAX_PASSWD_BYTES
                    )
                    live = rooted.parse_passwd(text.decode("utf-8", "replace"))
            found = rooted.find(user, live)
            if found is not None:
                return found
        if ids is not None:
            uid, gid = ids
            return Account(str(uid), uid, uid if gid is None else gid, "/")
        if user == "root":
            return ROOT
        raise SandboxPathError(f"no user {user!r} in the sandbox")

    async def exec(
        self, sandbox_id: str, request: ExecRequest, *, default_user: str
    ) -> CrunProcess:
        directory = self._dir(sandbox_id)
        meta = self._runnable(sandbox_id)
        account = await self._account(sandbox_id, meta, request.user or default_user)
        env = {
            **({"TERM": "xterm-256color"} if request.pty is not None else {}),
            "PATH": bundle.DEFAULT_PATH,
            "HOME": account.home,
            "USER": account.name,
            "LOGNAME": account.name,
            "LANG": "C.UTF-8",
            **meta.get("env", {}),
            **request.env,
        }
        start = request.cwd or meta.get("workdir") or account.home or "/"
        cwd = rooted.normalise(start, home=account.home)
        spawner = directory / spawn.SOCKET_NAME
        if spawner.exists():
            spawned = await spawn.spawn(
                spawner,
                request.cmd,
                env=env,
                uid=account.uid,
                gid=account.gid,
                cwd=cwd,
                sandbox_id=sandbox_id,
                pty=request.pty,
            )
            return await self._started(sandbox_id, spawned, spawned.pid, request)
        if request.pty is not None:
            raise Unsupported(f"sandbox {sandbox_id} was made without a spawner: no terminals")
        spec = bundle.process(
            [bundle.INIT_PATH, "exec", *request.cmd],
            uid=account.uid,
            gid=account.gid,
            cwd=cwd,
            env=env,
        )
        token = os.urandom(6).hex()
        process_file = directory / f"exec-{token}.json"
        pid_file = directory / f"exec-{token}.pid"
        process_file.write_text(json.dumps(spec))
        try:
            proc = await asyncio.create_subprocess_exec(
                self._bin(),
                "--root",
                str(self.state_dir),
                "exec",
                "--process",
                str(process_file),
                "--pid-file",
                str(pid_file),
                self._cid(sandbox_id),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            host_pid = await _wait_for_pid(pid_file, proc)
        finally:
            process_file.unlink(missing_ok=True)
            pid_file.unlink(missing_ok=True)
        if host_pid is None:
            err = b""
            if proc.stderr is not None:
                with contextlib.suppress(Exception):
                    err = await asyncio.wait_for(proc.stderr.read(), 1)
            await proc.wait()
            raise SandboxError(f"the command could not be started: {err.decode(errors='replace')}")
        return await self._started(sandbox_id, proc, host_pid, request)

    async def _started(
        self, sandbox_id: str, child: Child, host_pid: int, request: ExecRequest
    ) -> CrunProcess:
        processes = self._processes.setdefault(sandbox_id, set())
        process = CrunProcess(
            child,
            host_pid=host_pid,
            procs_file=self._cgroup("pids", sandbox_id) / "cgroup.procs",
            timeout_s=request.timeout_s,
            max_output_bytes=request.max_output_bytes,
            on_exit=lambda: processes.discard(process),
        )
        processes.add(process)
        if request.stdin is not None:
            await process.write_stdin(request.stdin.encode())
        if request.pty is None and (request.stdin is not None or not request.stdin_open):
            await process.close_stdin()
        return process

    # --- files --------------------------------------------------------------------------
    async def _files(self, sandbox_id: str, user: str) -> tuple[InitFiles, Account]:
        """The sandbox's init, to make file calls as ``user`` (refused at once if paused)."""
        meta = self._runnable(sandbox_id)
        account = await self._account(sandbox_id, meta, user)
        return InitFiles(self._dir(sandbox_id) / spawn.SOCKET_NAME, sandbox_id), account

    async def watch_dir(self, sandbox_id: str, path: str, *, user: str) -> DirWatch:
        files, who = await self._files(sandbox_id, user)
        directory = await files.open_dir(rooted.normalise(path), who)
        try:
            return InotifyWatch(directory)
        finally:
            os.close(directory)

    async def read_file(
        self, sandbox_id: str, path: str, *, user: str, max_bytes: int
    ) -> FileStream:
        files, who = await self._files(sandbox_id, user)
        return await files.read(path, who, max_bytes=max_bytes)

    async def write_file(
        self,
        sandbox_id: str,
        path: str,
        chunks: AsyncIterable[bytes],
        *,
        user: str,
        mode: int = 0o644,
    ) -> FileEntry:
        files, who = await self._files(sandbox_id, user)
        kills = self._oom_kills(sandbox_id)
        try:
            return await files.write(path, who, chunks, mode=mode)
        except SandboxUnresponsive:
            if kills is None or self._oom_kills(sandbox_id) == kills:
                raise
            # the upload's pages are the sandbox's: its memory is full, and the OOM killer
            # ended the call (corral-init makes it the first choice)
            raise DiskFull("the sandbox's memory (which its disk counts against) is full") from None

    def _oom_kills(self, sandbox_id: str) -> int | None:
        """How many processes the OOM killer has killed in the sandbox."""
        try:
            control = (self._cgroup("memory", sandbox_id) / "memory.oom_control").read_text()
        except OSError:
            return None
        counts = dict(line.split(maxsplit=1) for line in control.splitlines() if " " in line)
        value = counts.get("oom_kill", "")
        return int(value) if value.isdigit() else None

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
        files, who = await self._files(sandbox_id, user)
        return await files.list_page(path, who, depth=depth, limit=limit, cursor=cursor)

    async def stat(self, sandbox_id: str, path: str, *, user: str) -> FileEntry:
        files, who = await self._files(sandbox_id, user)
        return await files.stat(path, who)

    async def make_dir(self, sandbox_id: str, path: str, *, user: str) -> FileEntry:
        files, who = await self._files(sandbox_id, user)
        return await files.make_dir(path, who)

    async def remove(self, sandbox_id: str, path: str, *, user: str) -> None:
        if path == "/":
            raise SandboxPathError("the sandbox's root itself cannot be removed")
        files, who = await self._files(sandbox_id, user)
        await files.remove(path, who)

    async def move(self, sandbox_id: str, source: str, destination: str, *, user: str) -> FileEntry:
        if "/" in (source, destination):
            raise SandboxPathError("the sandbox's root itself cannot be moved")
        files, who = await self._files(sandbox_id, user)
        return await files.move(source, destination, who)

    async def _add_hosts(self, sandbox_id: str, hosts: dict[str, list[str]]) -> None:
        """The allow list's host names, as the node resolved them, in the sandbox's
        /etc/hosts (its programs connect to the addresses the rules allow); written by the
        sandbox's init as its root, as every write into a sandbox is."""
        files = InitFiles(self._dir(sandbox_id) / spawn.SOCKET_NAME, sandbox_id)
        try:
            current = await files.read_small("/etc/hosts", ROOT, max_bytes=1 << 20)
        except SandboxError:
            current = b"127.0.0.1\tlocalhost\n"
        lines = "".join(
            f"{address}\t{name}\n" for name, addrs in hosts.items() for address in addrs
        )
        data = current + (b"" if current.endswith(b"\n") else b"\n") + lines.encode()
        await files.write("/etc/hosts", ROOT, _once(data), mode=0o644)

    async def usage(self, sandbox_id: str) -> Usage:
        directory = self._dir(sandbox_id)

        def read() -> Usage:
            memory = _read_int(self._cgroup("memory", sandbox_id) / "memory.usage_in_bytes")
            cpu_ns = _read_int(self._cgroup("cpuacct", sandbox_id) / "cpuacct.usage")
            disk = None
            with contextlib.suppress(OSError):
                st = os.statvfs(directory / "layer")
                disk = (st.f_blocks - st.f_bfree) * st.f_frsize
            tasks = _read_int(self._cgroup("pids", sandbox_id) / "pids.current")
            return Usage(
                memory_bytes=memory,
                cpu_ms=cpu_ns / 1e6 if cpu_ns is not None else None,
                disk_bytes=disk,
                ended=tasks == 0,
            )

        return await asyncio.to_thread(read)

    # --- snapshots ------------------------------------------------------------------------
    def _snapshot_dir(self, snapshot_id: str) -> Path:
        if not snapshot_id.replace("_", "").replace("-", "").isalnum():
            raise SandboxNotFound(f"no snapshot {snapshot_id!r}")
        return self.root / ".snapshots" / snapshot_id

    async def snapshot(self, sandbox_id: str, snapshot_id: str) -> SnapshotFiles:
        directory = self._dir(sandbox_id)
        upper = directory / "layer" / "upper"
        if not upper.is_dir():
            raise SandboxNotFound(f"no sandbox {sandbox_id}")
        target = self._snapshot_dir(snapshot_id)
        staging = target.with_name(target.name + ".partial")
        ids = await asyncio.to_thread(self._ids_of, directory)
        # the copy keeps the ids files have inside (a layer serves any later range)
        reverse = None if ids is None else await self._namespaces.get(ids.reverse())
        frozen = (self._cgroup("freezer", sandbox_id) / "freezer.state").read_text().strip()
        if frozen == "THAWED":
            await self._freeze(sandbox_id)
        source = None
        try:
            await asyncio.to_thread(staging.parent.mkdir, parents=True, exist_ok=True)
            if reverse is not None:
                source = await asyncio.to_thread(mounts.idmapped_tree, upper, reverse)
            # cp -a keeps overlayfs's whiteouts (0/0 devices) and opaque-dir xattrs
            proc = await threadspawn.start(
                "cp",
                "-a",
                "--reflink=auto",
                str(upper) if source is None else mounts.fd_path(source) + "/",
                str(staging),
                stderr=subprocess.PIPE,
                pass_fds=() if source is None else (source,),
            )
            _, err = await communicate(proc)
            if proc.returncode != 0:
                await asyncio.to_thread(shutil.rmtree, staging, True)
                raise SandboxError(f"snapshot of {sandbox_id} failed: {err.decode()[:200]}")
        finally:
            if source is not None:
                os.close(source)
            if frozen == "THAWED":
                await self._runtime("resume", self._cid(sandbox_id))
        await asyncio.to_thread(staging.rename, target)
        size = await asyncio.to_thread(_tree_size, target)
        log.info("sandbox=%s: snapshot %s, %d bytes", sandbox_id, snapshot_id, size)
        return SnapshotFiles(snapshot_id=snapshot_id, layer=target, size_bytes=size)

    def snapshot_layer(self, snapshot_id: str) -> SnapshotFiles | None:
        target = self._snapshot_dir(snapshot_id)
        if not target.is_dir():
            return None
        return SnapshotFiles(snapshot_id=snapshot_id, layer=target, size_bytes=_tree_size(target))

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await asyncio.to_thread(shutil.rmtree, self._snapshot_dir(snapshot_id), True)

    # --- the runtime's command line -------------------------------------------------------
    def _cgroup(self, controller: str, sandbox_id: str) -> Path:
        return self.cgroup_root / controller / self.cgroup_parent / self._cid(sandbox_id)

    def _bin(self) -> str:
        if self._binary is None:
            raise BackendUnavailable("the crun backend is not started")
        return self._binary

    async def _runtime(self, *args: str, stdio: bool = True, fd3: int | None = None) -> bytes:
        """Run ``crun --root STATE ARGS``; its stdout. ``create``/``run -d`` get /dev/null
        for stdio: a pipe would be inherited by the container and never reach EOF.
        ``fd3`` is given to the runtime as its descriptor 3 (by ``corral-init fdexec``)."""
        command = [self._bin(), "--root", str(self.state_dir), *args]
        if fd3 is not None:
            command = [str(self.init_binary), "fdexec", str(fd3), *command]
        proc = await threadspawn.start(  # not the loop's fork: see node.threadspawn
            *command,
            stdout=subprocess.PIPE if stdio else subprocess.DEVNULL,
            stderr=subprocess.PIPE if stdio else subprocess.DEVNULL,
            pass_fds=() if fd3 is None else (fd3,),
        )
        out, err = await communicate(proc)
        if proc.returncode != 0:
            message = (err or b"").decode(errors="replace").strip() or f"exit {proc.returncode}"
            raise RuntimeCommandError(f"{self.runtime} {args[0]}: {message}")
        return out or b""

    async def _runtime_json(self, *args: str) -> Any:
        out = await self._runtime(*args)
        try:
            return json.loads(out or b"null")
        except ValueError as exc:
            raise RuntimeCommandError(f"{self.runtime} {args[0]}: not JSON") from exc


async def _wait_for_pid(pid_file: Path, proc: asyncio.subprocess.Process) -> int | None:
    deadline = time.monotonic() + PID_FILE_WAIT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            text = pid_file.read_text().strip()  # noqa: ASYNC240 - a tiny file
            if text:
                return int(text)
        if proc.returncode is not None:
            return None
        await asyncio.sleep(0.001)
    return None


def _attachment(directory: Path) -> Attachment | None:
    try:
        return Attachment.from_json((directory / NETWORK_FILE).read_text())
    except (OSError, ValueError, TypeError):
        return None


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def image_users(image: RootImage) -> dict[str, Account]:
    """The accounts of a sandbox's image (its base tree, trusted: never a snapshot's)."""
    return rooted.image_accounts(image.rootfs)


def _resolvers_allowed(spec: SandboxSpec) -> list[str]:
    """The addresses a sandbox's list allows on port 53 (``8.8.8.8:53``): its resolvers
    after the node's."""
    found = []
    for entry in spec.network.allow:
        destination = parse_destination(entry)
        network = destination.network
        if network is not None and network.prefixlen == 32 and destination.port == dns.PORT:
            found.append(str(network.network_address))
    return found


def _write_offline_resolv_conf(upper: Path, lowers: tuple[Path, ...], ids: IdRange | None) -> None:
    """``/etc/resolv.conf`` of a sandbox without a network (``dns.OFFLINE_RESOLV_CONF``),
    in its writable layer before it starts: it replaces the image's (whose resolvers
    the sandbox cannot reach), and the attach of a network replaces it. ``/etc`` in
    the layer takes the owner and mode of the image's (the layer's wins in the
    overlay); an image without a plain ``/etc`` is left alone."""
    etc = next((p / "etc" for p in lowers if os.path.lexists(p / "etc")), None)
    if etc is None or not etc.is_dir() or etc.is_symlink():
        return
    shift = 0 if ids is None else ids.first
    info = os.lstat(etc)
    (upper / "etc").mkdir(mode=0o700)
    os.chown(upper / "etc", info.st_uid + shift, info.st_gid + shift)
    os.chmod(upper / "etc", stat.S_IMODE(info.st_mode))
    path = upper / "etc" / "resolv.conf"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, dns.OFFLINE_RESOLV_CONF.encode())
        os.fchown(fd, shift, shift)
        os.fchmod(fd, 0o644)
    finally:
        os.close(fd)


def _write_private(path: Path, text: str) -> None:
    """A file of the node's, readable by host root only (env values are secrets)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _tree_size(root: Path) -> int:
    """The disk a tree takes: its files' allocated blocks (a sparse file counts what it
    stores, not its length)."""
    total = 0
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            info = path.lstat()
            if not stat.S_ISDIR(info.st_mode):
                total += info.st_blocks * 512
    return total


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def ensure_hugetlb_mount(cgroup_root: Path) -> None:
    """crun refuses a hybrid cgroup layout whose hugetlb controller is not mounted as v1
    (it is left in the v2 tree): mount it once per boot, idempotently."""
    target = cgroup_root / "hugetlb"
    if not (cgroup_root / "memory").is_dir() or mounts.is_mount(target):
        return
    try:
        target.mkdir(exist_ok=True)
        mounts.mount("cgroup", target, "cgroup", "hugetlb")
        log.info("mounted the hugetlb cgroup controller at %s (crun needs it on v1)", target)
    except OSError as exc:
        raise BackendUnavailable(
            f"crun needs the hugetlb cgroup controller mounted at {target}: {exc}; "
            "or install runc, which needs no hugetlb controller"
        ) from exc
