"""What a call leaves behind, removed: every process but PID 1 and the template, the
files under a directory, and SysV IPC objects."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import time

from node.fncall.nsjail.zygote.accounting import _jail_pids
from node.fncall.nsjail.zygote.startup import _libc

IPC_RMID = 0


def _kill_all(keep: frozenset[int]) -> None:
    """SIGKILL every process in the jail but PID 1 and ``keep`` (the template), and reap
    them all. Processes are listed from /proc and killed one by one (``kill(-1)`` would
    take the template too), again until none is left: what a dying process forked in
    between is found on the next round; the jail's pids limit bounds the rounds."""
    deadline = time.monotonic() + 5.0
    while True:
        others = _jail_pids(keep)
        for pid, _ in others:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if not others:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("processes survive SIGKILL")
        time.sleep(0.0005)


def _remove_sysv_ipc() -> None:
    """Delete the SysV shared memory, message queues and semaphores the code left in
    the jail's IPC namespace (they outlive the processes that made them)."""
    import ctypes

    libc = _libc()
    for table in ("shm", "msg", "sem"):
        try:
            with open(f"/proc/sysvipc/{table}") as f:
                rows = f.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            ident = int(row.split()[1])
            if table == "sem":
                rc = libc.semctl(ident, 0, IPC_RMID)
            else:
                rc = getattr(libc, f"{table}ctl")(ident, IPC_RMID, None)
            if rc != 0 and ctypes.get_errno() not in (errno.EINVAL, errno.EIDRM):
                raise OSError(ctypes.get_errno(), f"cannot remove SysV {table} {ident}")


def _wipe(root: str) -> None:
    """Remove everything under ``root`` (not root itself), whatever its permissions."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    for name in names:
        path = os.path.join(root, name)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(info.st_mode):
            if stat.S_IMODE(info.st_mode) & 0o700 != 0o700:
                os.chmod(path, 0o700)
            _wipe(path)
            os.rmdir(path)
        else:
            os.unlink(path)
