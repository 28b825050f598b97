"""Paths and accounts of a sandbox, as the node needs them from the host side.

The node does no file call of a tenant's from outside the sandbox (those run inside it,
as the user they name: ``node.sandboxes.crun.fileops``). What is left here: the
normalised form of a path inside a sandbox, and the accounts of an *image* (its trusted,
read-only ``/etc/passwd``, read at a sandbox's creation), which decide which uid a user
name means before the sandbox's own, writable ``/etc/passwd`` is asked. The image's tree
is still read with ``openat2(2)`` and ``RESOLVE_IN_ROOT`` (a symlink in it means the
image's own root, never the host's), and only a regular file is ever opened.
"""

from __future__ import annotations

import ctypes
import os
import posixpath
import stat
from dataclasses import dataclass
from pathlib import Path

from node.sandboxes.base import SandboxPathError

_SYS_OPENAT2 = 437  # x86_64 and aarch64
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
_RESOLVE = _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS
_libc = ctypes.CDLL(None, use_errno=True)
MAX_PATH_BYTES = 4096
#: the most of an /etc/passwd that is read
MAX_PASSWD_BYTES = 1 << 20


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2(root_fd: int, path: str, flags: int, mode: int = 0) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode, _RESOLVE)
    fd = _libc.syscall(
        ctypes.c_long(_SYS_OPENAT2),
        ctypes.c_int(root_fd),
        ctypes.c_char_p(path.encode("utf-8", "surrogateescape")),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


@dataclass(frozen=True, slots=True)
class Account:
    name: str
    uid: int
    gid: int
    home: str


ROOT = Account("root", 0, 0, "/root")


def normalise(path: str, *, home: str = "/") -> str:
    """An absolute, normalised path inside the sandbox (relative ones are from ``home``)."""
    if not path or "\x00" in path or len(path.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        raise SandboxPathError(f"invalid path {path!r}")
    joined = posixpath.normpath(posixpath.join(home, path))
    return "/" + joined.lstrip("/")  # normpath keeps a leading "//"


def parse_passwd(text: str) -> dict[str, Account]:
    """The accounts of an ``/etc/passwd`` (lines that do not parse are passed over)."""
    accounts: dict[str, Account] = {}
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 6 and fields[0] and fields[2].isdigit() and fields[3].isdigit():
            uid, gid = int(fields[2]), int(fields[3])
            if uid < 1 << 32 and gid < 1 << 32:
                accounts.setdefault(fields[0], Account(fields[0], uid, gid, fields[5] or "/"))
    return accounts


def image_accounts(rootfs: Path) -> dict[str, Account]:
    """The accounts of the image whose tree is ``rootfs`` (none if it has no passwd)."""
    try:
        root = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        where = openat2(root, "/etc/passwd", os.O_PATH)
    except OSError:
        return {}
    finally:
        os.close(root)
    try:
        if not stat.S_ISREG(os.fstat(where).st_mode):
            return {}
        fd = os.open(f"/proc/self/fd/{where}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return {}
    finally:
        os.close(where)
    try:
        text = os.read(fd, MAX_PASSWD_BYTES)
    except OSError:
        return {}
    finally:
        os.close(fd)
    return parse_passwd(text.decode("utf-8", "replace"))


def numeric(user: str) -> tuple[int, int | None] | None:
    """``uid`` or ``uid:gid`` as numbers (None: ``user`` is a name)."""
    uid_s, colon, gid_s = user.partition(":")
    if not uid_s.isdigit() or (colon and not gid_s.isdigit()):
        return None
    uid, gid = int(uid_s), int(gid_s) if colon else None
    if uid >= (1 << 32) - 1 or (gid is not None and gid >= (1 << 32) - 1):
        raise SandboxPathError(f"no user {user!r}: ids are below 4294967295")
    return uid, gid


def find(user: str, accounts: dict[str, Account]) -> Account | None:
    """``user`` (a name, ``uid`` or ``uid:gid``) among ``accounts``, if it is there; a
    number there or not is itself (its group the account's with that uid, else the uid)."""
    ids = numeric(user)
    if ids is None:
        return accounts.get(user)
    uid, gid = ids
    known = next((a for a in accounts.values() if a.uid == uid), None)
    if known is None:
        return None
    return Account(known.name, uid, known.gid if gid is None else gid, known.home)
