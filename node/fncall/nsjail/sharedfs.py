"""The small directory the host shares read-only with every jail: the generated
``/etc/passwd``, ``/etc/group`` and ``/etc/hosts``, and what is mounted over what a jail
must not see: an empty file (host-wide ``/proc`` files), an empty directory
(``/usr/local``), and a ``/proc/stat`` whose counters are all zero (``PROC_STAT``: the
format and the CPU count kept, so that node's ``os.cpus()`` still counts the CPUs).

It is a tmpfs of its own (1 MiB, remounted read-only once written) when the host may
mount one: a bind mount names its source by its path inside the source file system, so
the jail's ``/proc/self/mountinfo`` then shows ``/passwd`` on ``tmpfs corral-jail``
instead of a host path. Without the privilege to mount (a development box), it is a plain
temporary directory and the mountinfo names its path.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

#: In-jail uid/gid: nobody/nogroup, mapped to the same ids on the host.
JAIL_UID = 65534
JAIL_GID = 65534

GENERATED_ETC = {
    "passwd": f"nobody:x:{JAIL_UID}:{JAIL_GID}:nobody:/tmp:/usr/sbin/nologin\n",
    "group": f"nogroup:x:{JAIL_GID}:\n",
    "hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
}
EMPTY_FILE = "empty"
EMPTY_DIR = "empty.d"
PROC_STAT = "stat"
FS_NAME = "corral-jail"
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MNT_DETACH = 2


@dataclass(frozen=True, slots=True)
class SharedDir:
    path: Path
    mounted: bool

    @property
    def empty_file(self) -> Path:
        return self.path / EMPTY_FILE

    @property
    def empty_dir(self) -> Path:
        return self.path / EMPTY_DIR

    @property
    def proc_stat(self) -> Path:
        return self.path / PROC_STAT

    def etc(self, name: str) -> Path:
        return self.path / name

    def remove(self) -> None:
        """Unmount (when mounted) and delete it; idempotent."""
        if self.mounted and os.path.ismount(self.path):
            _mount_call("umount2", str(self.path).encode(), _MNT_DETACH)
        shutil.rmtree(self.path, ignore_errors=True)


def create() -> SharedDir:
    """Make the directory and fill it (files 0644, the directory 0755, owned by root)."""
    path = Path(tempfile.mkdtemp(prefix="corral-nsjail-etc-"))
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    try:
        _mount_call(
            "mount", FS_NAME.encode(), str(path).encode(), b"tmpfs", flags, b"size=1m,mode=0755"
        )
        mounted = True
    except OSError as exc:
        logger.warning("jail files in a plain directory (cannot mount a tmpfs: %s)", exc)
        mounted = False
    shared = SharedDir(path, mounted)
    try:
        for name, text in GENERATED_ETC.items():
            shared.etc(name).write_text(text)
            shared.etc(name).chmod(0o644)
        shared.empty_file.write_bytes(b"")
        shared.empty_file.chmod(0o444)
        shared.proc_stat.write_text(zero_proc_stat(len(os.sched_getaffinity(0))))
        shared.proc_stat.chmod(0o444)
        shared.empty_dir.mkdir(mode=0o555)
        path.chmod(0o755)
        if mounted:
            flags |= _MS_REMOUNT | _MS_RDONLY
            _mount_call("mount", FS_NAME.encode(), str(path).encode(), b"tmpfs", flags, None)
    except BaseException:
        shared.remove()
        raise
    return shared


def zero_proc_stat(cpus: int) -> str:
    """``/proc/stat`` with every counter zero: CPU times, interrupts, context switches,
    boot time, process counts (the host's activity and boot time are what it hides)."""
    idle = " 0 0 0 0 0 0 0 0 0 0"
    lines = [f"cpu {idle}", *(f"cpu{n}{idle}" for n in range(cpus))]
    lines += ["intr 0", "ctxt 0", "btime 0", "processes 0", "procs_running 1"]
    lines += ["procs_blocked 0", "softirq 0 0 0 0 0 0 0 0 0 0 0"]
    return "\n".join(lines) + "\n"


def _mount_call(name: str, *args: object) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")
