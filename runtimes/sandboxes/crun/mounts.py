"""mount(2) and umount2(2) for the writable layer of a sandbox (no shelling out)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
MS_NOSUID, MS_NODEV, MS_REMOUNT = 0x2, 0x4, 0x20
MNT_DETACH = 0x2


def mount(source: str, target: Path, fstype: str, options: str, flags: int = 0) -> None:
    result = _libc.mount(
        source.encode(),
        str(target).encode(),
        fstype.encode(),
        ctypes.c_ulong(flags),
        options.encode(),
    )
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype} on {target}: {os.strerror(err)}")


def unmount(target: Path) -> None:
    """Detach ``target``; nothing mounted there is fine."""
    if _libc.umount2(str(target).encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (22, 2):  # EINVAL: not a mount point; ENOENT: gone
            raise OSError(err, f"umount {target}: {os.strerror(err)}")


def is_mount(path: Path) -> bool:
    return os.path.ismount(path)
