"""Control groups: which hierarchy this host offers, nsjail's flags for it, and the host's
handle on one jail's cgroup.

nsjail creates ``NSJAIL.<pid>`` for each jail (under ``<controller>/<parent>`` on cgroup
v1, under its own cgroup on v2) and removes it when the jail ends. The host then narrows
the memory and pids limits per call and reads the OOM-kill counter to tell an OOM death
from any other SIGKILL.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from runtimes.nsjail.config import NsjailConfig

logger = logging.getLogger(__name__)


class CgroupError(RuntimeError):
    pass


class CgroupMode(StrEnum):
    V1 = "v1"
    V2 = "v2"
    OFF = "off"


@dataclass(frozen=True, slots=True)
class CgroupSetup:
    """The hierarchy in use and where each controller is mounted."""

    mode: CgroupMode
    parent: str
    memory: Path | None = None  # v1 controller mounts
    pids: Path | None = None
    cpu: Path | None = None
    root: Path | None = None  # v2 mount

    def nsjail_flags(self, *, memory_bytes: int, pids: int, cpu_ms_per_sec: int) -> list[str]:
        if self.mode is CgroupMode.OFF:
            return []
        flags = ["--cgroup_mem_max", str(memory_bytes), "--cgroup_pids_max", str(pids)]
        if self.mode is CgroupMode.V2:
            assert self.root is not None
            flags += ["--use_cgroupv2", "--cgroupv2_mount", str(self.root)]
            if cpu_ms_per_sec:
                flags += ["--cgroup_cpu_ms_per_sec", str(cpu_ms_per_sec)]
            return flags
        assert self.memory is not None and self.pids is not None
        flags += ["--cgroup_mem_mount", str(self.memory), "--cgroup_mem_parent", self.parent]
        flags += ["--cgroup_pids_mount", str(self.pids), "--cgroup_pids_parent", self.parent]
        if cpu_ms_per_sec and self.cpu is not None:
            flags += ["--cgroup_cpu_mount", str(self.cpu), "--cgroup_cpu_parent", self.parent]
            flags += ["--cgroup_cpu_ms_per_sec", str(cpu_ms_per_sec)]
        return flags

    def ensure_parents(self) -> None:
        """Create the v1 parent cgroups nsjail requires (v2 needs none)."""
        if self.mode is not CgroupMode.V1:
            return
        for mount in (self.memory, self.pids, self.cpu):
            if mount is None:
                continue
            try:
                (mount / self.parent).mkdir(exist_ok=True)
            except OSError as exc:
                raise CgroupError(f"cannot create cgroup {mount / self.parent}: {exc}") from exc

    def for_jail(self, zygote_pid: int) -> JailCgroup | None:
        if self.mode is CgroupMode.V1:
            assert self.memory is not None and self.pids is not None
            name = f"NSJAIL.{zygote_pid}"
            return V1JailCgroup(
                memory=self.memory / self.parent / name,
                pids=self.pids / self.parent / name,
                cpu=self.cpu / self.parent / name if self.cpu is not None else None,
            )
        if self.mode is CgroupMode.V2:
            assert self.root is not None
            return V2JailCgroup.of_pid(self.root, zygote_pid)
        return None

    def remove_jail(self, zygote_pid: int) -> None:
        """Remove a jail's v1 cgroups if nsjail could not (best effort)."""
        if self.mode is not CgroupMode.V1:
            return
        for mount in (self.memory, self.pids, self.cpu):
            if mount is not None:
                _rmdir(mount / self.parent / f"NSJAIL.{zygote_pid}")


def _cgroup_mounts() -> tuple[dict[str, Path], Path | None]:
    """v1 controller -> mount point, and the v2 mount at the root (if any)."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) < 4:
                continue
            mount_point, fstype, options = fields[1], fields[2], fields[3].split(",")
            if fstype == "cgroup":
                for controller in ("memory", "pids", "cpu"):
                    if controller in options:
                        v1.setdefault(controller, Path(mount_point))
            elif fstype == "cgroup2":
                v2 = Path(mount_point) if v2 is None or mount_point == "/sys/fs/cgroup" else v2
    return v1, v2


def detect(config: NsjailConfig) -> CgroupSetup:
    """The hierarchy to use, per ``config.cgroups`` ('auto' prefers v1 memory+pids)."""
    if config.cgroups == "off":
        return CgroupSetup(CgroupMode.OFF, config.cgroup_parent)
    v1, v2 = _cgroup_mounts()
    want = config.cgroups
    if want in ("auto", "v1") and "memory" in v1 and "pids" in v1:
        return CgroupSetup(
            CgroupMode.V1,
            config.cgroup_parent,
            memory=v1["memory"],
            pids=v1["pids"],
            cpu=v1.get("cpu"),
        )
    if want in ("auto", "v2") and v2 is not None:
        controllers = (v2 / "cgroup.controllers").read_text().split()
        if "memory" in controllers and "pids" in controllers:
            return CgroupSetup(CgroupMode.V2, config.cgroup_parent, root=v2)
    return CgroupSetup(CgroupMode.OFF, config.cgroup_parent)


class JailCgroup(Protocol):
    def set_limits(self, *, memory_bytes: int, pids: int) -> None: ...

    def oom_kills(self) -> int | None: ...

    def memory_bytes(self) -> int | None: ...

    def remove(self) -> None: ...


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_counter(path: Path, key: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _rmdir(path: Path | None) -> None:
    if path is None:
        return
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("cannot remove cgroup %s: %s", path, exc)


class V1JailCgroup:
    def __init__(self, *, memory: Path, pids: Path, cpu: Path | None) -> None:
        self.memory = memory
        self.pids = pids
        self.cpu = cpu
        self._memory_bytes: int | None = None
        self._pids: int | None = None
        if not memory.is_dir() or not pids.is_dir():
            raise CgroupError(f"jail cgroup {memory} or {pids} does not exist")
        self._memsw = (memory / "memory.memsw.limit_in_bytes").exists()
        try:
            # the limit nsjail set; the order of the memsw/memory writes depends on it
            self._memory_bytes = int((memory / "memory.limit_in_bytes").read_text())
        except (OSError, ValueError) as exc:
            raise CgroupError(f"cannot read the memory limit of {memory}: {exc}") from exc

    def set_limits(self, *, memory_bytes: int, pids: int) -> None:
        try:
            if memory_bytes != self._memory_bytes:
                growing = self._memory_bytes is None or memory_bytes > self._memory_bytes
                if self._memory_bytes is None:  # unknown after a failed write: re-read it
                    current = int((self.memory / "memory.limit_in_bytes").read_text())
                    growing = memory_bytes > current
                # v1 keeps limit <= memsw limit: raise memsw first, lower it last
                order = ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes")
                for name in order if growing else reversed(order):
                    if name.startswith("memory.memsw") and not self._memsw:
                        continue
                    _write(self.memory / name, str(memory_bytes))
                self._memory_bytes = memory_bytes
            if pids != self._pids:
                _write(self.pids / "pids.max", str(pids))
                self._pids = pids
        except (OSError, ValueError) as exc:
            self._memory_bytes = self._pids = None
            raise CgroupError(f"cannot set limits on {self.memory}: {exc}") from exc

    def oom_kills(self) -> int | None:
        return _read_counter(self.memory / "memory.oom_control", "oom_kill")

    def memory_bytes(self) -> int | None:
        """Memory the jail uses now (tmpfs pages included)."""
        return _read_int(self.memory / "memory.usage_in_bytes")

    def remove(self) -> None:
        for path in (self.memory, self.pids, self.cpu):
            _rmdir(path)


class V2JailCgroup:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._memory_bytes: int | None = None
        self._pids: int | None = None

    @classmethod
    def of_pid(cls, root: Path, pid: int) -> V2JailCgroup:
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                for line in f:
                    if line.startswith("0::"):
                        return cls(root / line[3:].strip().lstrip("/"))
        except OSError as exc:
            raise CgroupError(f"cannot read the cgroup of pid {pid}: {exc}") from exc
        raise CgroupError(f"pid {pid} is in no cgroup v2 group")

    def set_limits(self, *, memory_bytes: int, pids: int) -> None:
        try:
            if memory_bytes != self._memory_bytes:
                _write(self.path / "memory.max", str(memory_bytes))
                try:
                    _write(self.path / "memory.swap.max", "0")
                except OSError as exc:
                    if exc.errno != errno.ENOENT:
                        raise
                self._memory_bytes = memory_bytes
            if pids != self._pids:
                _write(self.path / "pids.max", str(pids))
                self._pids = pids
        except OSError as exc:
            self._memory_bytes = self._pids = None
            raise CgroupError(f"cannot set limits on {self.path}: {exc}") from exc

    def oom_kills(self) -> int | None:
        return _read_counter(self.path / "memory.events", "oom_kill")

    def memory_bytes(self) -> int | None:
        """Memory the jail uses now (tmpfs pages included)."""
        return _read_int(self.path / "memory.current")

    def remove(self) -> None:
        _rmdir(self.path)


def process_count(cgroup: JailCgroup | None) -> int | None:
    """Tasks in a jail's pids cgroup (diagnostics only)."""
    if isinstance(cgroup, V1JailCgroup):
        path = cgroup.pids / "pids.current"
    elif isinstance(cgroup, V2JailCgroup):
        path = cgroup.path / "pids.current"
    else:
        return None
    return _read_int(path)
