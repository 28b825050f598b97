"""Copying and removing image trees without ever crossing into a mount.

A build mounts /proc and /dev inside a rootfs only in a private mount namespace, so the
mounts end with it; ``remove_tree`` still refuses a tree with a mount under it (a crashed
build that mounted outside a namespace), rather than deleting through it into the host.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
from pathlib import Path

from images.errors import ImageBuildError, ImageError

log = logging.getLogger(__name__)


def _unescape(field: str) -> str:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo.
    return field.encode().decode("unicode_escape").encode("latin-1").decode(errors="replace")


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path``."""
    base = os.path.realpath(path)
    found: list[Path] = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = _unescape(line.split()[4])
            if point == base or point.startswith(base.rstrip("/") + "/"):
                found.append(Path(point))
    return found


def remove_tree(path: Path) -> None:
    """Delete ``path`` (a directory tree, or a file), also read-only directories in it."""
    if not os.path.lexists(path):
        return
    if not path.is_dir() or path.is_symlink():
        path.unlink()
        return
    mounted = mounts_under(path)
    if mounted:
        raise ImageError(f"refusing to delete {path}: mounts under it: {mounted[:3]}")

    def make_writable(func: object, target: str, exc: BaseException) -> None:
        parent = os.path.dirname(target)
        os.chmod(parent, stat.S_IMODE(os.lstat(parent).st_mode) | stat.S_IRWXU)
        if os.path.isdir(target) and not os.path.islink(target):
            os.chmod(target, stat.S_IMODE(os.lstat(target).st_mode) | stat.S_IRWXU)
            shutil.rmtree(target)
        else:
            os.unlink(target)

    shutil.rmtree(path, onexc=make_writable)


def copy_tree(src: Path, dst: Path) -> None:
    """``cp -a --reflink=auto src dst``: owners, modes, links, devices and xattrs kept;
    a reflink where the filesystem can share blocks. ``dst`` must not exist."""
    done = subprocess.run(
        ["cp", "-a", "--reflink=auto", "--", str(src), str(dst)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise ImageBuildError(f"copying {src} to {dst} failed: {done.stderr.strip()[-500:]}")


MAX_SYMLINKS = 40


def resolve_in_root(rootfs: Path, path: str) -> Path:
    """``path`` (absolute or relative to the image's /) as the host path it names inside
    ``rootfs``, following the tree's symlinks as a process chrooted in it would: an
    absolute target restarts at ``rootfs``, ``..`` stops at it. The result never lies
    outside ``rootfs`` (its last component may not exist yet)."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    resolved: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = rootfs.joinpath(*resolved, part)
        if candidate.is_symlink():
            hops += 1
            if hops > MAX_SYMLINKS:
                raise ImageBuildError(f"too many levels of symlinks in {path!r}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        resolved.append(part)
    return rootfs.joinpath(*resolved)
