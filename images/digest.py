"""The digest of a root filesystem: the same tree always gives the same digest.

A deterministic walk (paths sorted bytewise, symlinks never followed) feeds one SHA-256
with a record per entry: its path, type, permission bits (setuid/setgid/sticky too), uid,
gid, and a symlink's target, a device's numbers or a regular file's content hash.
Timestamps, inode numbers and extended attributes are not part of it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

_CHUNK = 1 << 20


@dataclass(frozen=True)
class TreeSummary:
    digest: str  # "sha256:<hex>"
    size_bytes: int  # regular files' sizes, each hard-linked inode counted once
    entries: int


def _file_hash(path: bytes) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        while chunk := os.read(fd, _CHUNK):
            h.update(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()


def _record(rel: bytes, full: bytes, st: os.stat_result) -> bytes:
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        kind, extra = b"d", b""
    elif stat.S_ISREG(mode):
        kind, extra = b"f", _file_hash(full).encode()
    elif stat.S_ISLNK(mode):
        kind, extra = b"l", os.readlink(full)
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        kind = b"c" if stat.S_ISCHR(mode) else b"b"
        extra = f"{os.major(st.st_rdev)},{os.minor(st.st_rdev)}".encode()
    elif stat.S_ISFIFO(mode):
        kind, extra = b"p", b""
    else:
        kind, extra = b"s", b""
    head = f"{stat.S_IMODE(mode):o} {st.st_uid} {st.st_gid}".encode()
    # NUL cannot occur in a path or a link target, so the record is unambiguous.
    return b"\0".join((rel, kind, head, extra)) + b"\n"


def summarize(root: Path) -> TreeSummary:
    """Digest and size of the tree under ``root`` (``root`` itself is the entry ``.``)."""
    base = os.fsencode(root)
    h = hashlib.sha256()
    size = 0
    entries = 0
    seen: set[tuple[int, int]] = set()
    pending: list[bytes] = [b"."]
    while pending:
        rel = pending.pop()
        full = base if rel == b"." else os.path.join(base, rel)
        st = os.lstat(full)
        h.update(_record(rel, full, st))
        entries += 1
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            size += st.st_size
        if stat.S_ISDIR(st.st_mode):
            names = sorted(os.listdir(full))
            prefix = b"" if rel == b"." else rel + b"/"
            # Reversed onto the stack, so entries come off in sorted (pre-)order.
            pending.extend(prefix + name for name in reversed(names))
    return TreeSummary(digest="sha256:" + h.hexdigest(), size_bytes=size, entries=entries)
