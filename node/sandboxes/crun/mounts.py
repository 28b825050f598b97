"""The mount system calls a sandbox's file tree is built with (no shelling out).

``mount``/``unmount``: the writable layer's tmpfs and the overlay. ``idmapped_tree``: a
detached copy of a directory tree whose files' owners are shifted through a user
namespace's map (``open_tree(2)`` + ``mount_setattr(2)`` with ``MOUNT_ATTR_IDMAP``): the
image, stored with the ids its files have inside (0-65535), serves every sandbox, each
seeing it owned by its own host range, without a copy. The tree is never attached
anywhere on the host; overlayfs takes it as a lower layer by its descriptor
(``fd_path``), and it lives as long as the overlay holds it.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT = 0x1, 0x2, 0x4, 0x20
MNT_DETACH = 0x2

# x86-64 and aarch64 share these numbers (the "generic" table's newer calls)
_SYS_OPEN_TREE = 428
_SYS_MOUNT_SETATTR = 442
_OPEN_TREE_CLONE = 0x1
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_AT_FDCWD = -100
_MOUNT_ATTR_IDMAP = 0x00100000


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _failed(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str, target: Path, fstype: str, options: str, flags: int = 0) -> None:
    result = _libc.mount(
        source.encode(),
        str(target).encode(),
        fstype.encode(),
        ctypes.c_ulong(flags),
        options.encode(),
    )
    if result != 0:
        raise _failed(f"mount {fstype} on {target}")


def unmount(target: Path) -> None:
    """Detach ``target``; nothing mounted there is fine."""
    if _libc.umount2(str(target).encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (22, 2):  # EINVAL: not a mount point; ENOENT: gone
            raise OSError(err, f"umount {target}: {os.strerror(err)}")


def is_mount(path: Path) -> bool:
    return os.path.ismount(path)


def idmapped_tree(path: Path, userns_fd: int) -> int:
    """A detached clone of the tree at ``path`` whose ids are mapped through the user
    namespace ``userns_fd`` (an id ``k`` on disk reads as what that namespace's id ``k``
    is on the host); its descriptor, which the caller closes."""
    fd = _libc.syscall(
        ctypes.c_long(_SYS_OPEN_TREE),
        ctypes.c_int(_AT_FDCWD),
        ctypes.c_char_p(str(path).encode()),
        ctypes.c_uint(_OPEN_TREE_CLONE | _AT_RECURSIVE | os.O_CLOEXEC),
    )
    if fd < 0:
        raise _failed(f"open_tree {path}")
    attr = _MountAttr(_MOUNT_ATTR_IDMAP, 0, 0, userns_fd)
    result = _libc.syscall(
        ctypes.c_long(_SYS_MOUNT_SETATTR),
        ctypes.c_int(fd),
        ctypes.c_char_p(b""),
        ctypes.c_uint(_AT_EMPTY_PATH | _AT_RECURSIVE),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    if result != 0:
        error = _failed(f"mount_setattr (idmap) {path}")
        os.close(fd)
        raise error
    return int(fd)


def fd_path(fd: int) -> str:
    """How a mount option names a directory the node holds open: a path that shows no
    host directory in the sandbox's ``/proc/self/mountinfo``."""
    return f"/proc/self/fd/{fd}"
