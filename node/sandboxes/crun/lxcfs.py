"""A sandbox's own memory, CPU and uptime figures where programs read the host's: LXCFS.

``/proc/meminfo``, ``cpuinfo``, ``stat``, ``uptime``, ``loadavg``, ``diskstats``, ``swaps``
and ``/sys/devices/system/cpu/online`` are host-wide files: inside a container they would
show the host's memory and CPUs, so a program sizes itself past its limits (a JVM heap, a
build's ``-j``) and learns the node's size. LXCFS (Debian's ``lxcfs``, a FUSE file system)
serves the same files computed from the cgroups of the process that reads them: the
sandbox's memory limit as MemTotal, its CPU quota as its CPUs (``--enable-cfs``), its
own uptime and load. Each sandbox bind-mounts them over the host's (``views``).

One LXCFS serves the whole host (every node on it), mounted at a fixed directory and
started on first need by whichever node finds it missing or dead (under a host-wide lock);
a create that finds it dead (its mount answers ENOTCONN: the process ended) restarts it.
it is not the node's child, so sandboxes a node left running keep their figures across
the node's restarts. It runs in a cgroup of its own with a CPU quota, so a sandbox that
reads these files in a loop slows only these reads, never the node. Without ``lxcfs``
installed, sandboxes see the host's figures, and the node says so once.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from node.sandboxes.crun import mounts

log = logging.getLogger(__name__)

DEFAULT_DIR = Path("/run/corral/lxcfs")
#: the files LXCFS computes per reader, by their place inside the sandbox
VIEWS = (
    "/proc/cpuinfo",
    "/proc/diskstats",
    "/proc/loadavg",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/swaps",
    "/proc/uptime",
    "/sys/devices/system/cpu/online",
)
START_WAIT_S = 10.0
CGROUP = "corral-lxcfs"
#: LXCFS's CPU quota: half a core, whatever the sandboxes read
CPU_QUOTA_US, CPU_PERIOD_US = 50_000, 100_000


class Lxcfs:
    def __init__(
        self, directory: Path | None = DEFAULT_DIR, *, cgroup_root: Path = Path("/sys/fs/cgroup")
    ) -> None:
        """``directory`` None: the operator turned it off (sandboxes see the host's)."""
        self.directory = directory or DEFAULT_DIR
        self.enabled = directory is not None
        self._cgroup_root = cgroup_root
        self.serving = False
        #: a pidfd of the LXCFS that serves: whether it ended is one poll, not a FUSE read
        self._pidfd: int | None = None

    async def ensure(self) -> bool:
        """Make sure LXCFS serves ``directory``; whether it does."""
        if self.enabled:
            self.serving = await asyncio.to_thread(self._ensure)
        return self.serving

    def views(self) -> list[dict[str, Any]]:
        """Bind mounts of the sandbox's own figures (none when LXCFS does not serve), for
        a sandbox about to start: blocking (called off the event loop). A dead LXCFS is
        restarted first, so the new sandbox never binds a mount that answers ENOTCONN."""
        if self.serving and self._ended():
            self.serving = self._ensure()
        if not self.serving:
            return []
        return [
            {
                "destination": path,
                "type": "bind",
                "source": str(self.directory / path.lstrip("/")),
                "options": ["bind", "ro", "nosuid", "nodev", "noexec"],
            }
            for path in VIEWS
        ]

    def _ensure(self) -> bool:
        binary = shutil.which("lxcfs")
        if binary is None:
            log.warning(
                "lxcfs is not installed: sandboxes see the host's memory, CPUs and uptime "
                "in /proc (run scripts/setup-sandboxes.sh)"
            )
            return False
        self.directory.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.directory, 0o755)  # a dead mount here is a directory too
        lock = os.open(f"{self.directory}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self._alive():
                mounts.unmount(self.directory)  # a dead one's mount answers ENOTCONN
                if not self._start(binary):
                    return False
            self._watch()
            return True
        finally:
            os.close(lock)

    def _watch(self) -> None:
        """Keep a pidfd of the serving LXCFS (by its pid file)."""
        self.close()
        with contextlib.suppress(OSError, ValueError):
            pid = int(Path(f"{self.directory}.pid").read_text().split()[0])
            self._pidfd = os.pidfd_open(pid)

    def close(self) -> None:
        """Let go of the pidfd (LXCFS serves on, for the host's other nodes)."""
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _ended(self) -> bool:
        """Whether the LXCFS this node found serving has ended (without a pidfd: whether
        its mount no longer answers)."""
        if self._pidfd is None:
            return not self._answers()
        return bool(select.select([self._pidfd], [], [], 0)[0])

    def _alive(self) -> bool:
        return _is_lxcfs_mount(self.directory) and self._answers()

    def _answers(self) -> bool:
        """Whether the mount serves (one small read; a dead FUSE answers ENOTCONN)."""
        try:
            with open(self.directory / "proc" / "uptime", "rb") as f:
                return bool(f.read(64))
        except OSError as err:
            if err.errno != errno.ENOTCONN:
                log.warning("lxcfs at %s does not answer: %s", self.directory, err)
            return False

    def _start(self, binary: str) -> bool:
        # setsid -f: LXCFS is not the node's child and outlives it
        command = ["setsid", "-f", binary, "--enable-cfs", "--enable-loadavg"]
        command += ["--pidfile", f"{self.directory}.pid", str(self.directory)]
        subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
            timeout=START_WAIT_S,
        )
        deadline = time.monotonic() + START_WAIT_S
        while time.monotonic() < deadline:
            if self._alive():
                self._confine()
                log.info("lxcfs serves sandboxes' /proc figures from %s", self.directory)
                return True
            time.sleep(0.02)
        log.warning("lxcfs did not start at %s: sandboxes see the host's figures", self.directory)
        return False

    def _confine(self) -> None:
        """Put LXCFS in a cgroup of its own with a CPU quota."""
        with contextlib.suppress(OSError, ValueError):
            pid = int(Path(f"{self.directory}.pid").read_text().split()[0])
            group = self._cgroup_root / "cpu" / CGROUP
            group.mkdir(exist_ok=True)
            (group / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(CPU_QUOTA_US))
            (group / "cgroup.procs").write_text(str(pid))


def _is_lxcfs_mount(directory: Path) -> bool:
    target = str(directory)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4 and fields[4] == target and " - fuse.lxcfs " in line:
                return True
    return False
