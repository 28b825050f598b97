"""COPY: files of the build context into the tree being built.

Sources are paths (or globs) relative to the context directory and must stay in it once
symlinks are resolved. The destination is resolved inside the tree the way a chrooted
process would see it (``fsutil.resolve_in_root``), so a symlink of the image can never
send a file to the host. Copied files keep their modes; their owner is root, or the
``--chown`` user and group as the image's own /etc/passwd and /etc/group name them.
Inside a copied directory symlinks are copied as symlinks, never followed.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
from pathlib import Path

from images.errors import ImageBuildError
from images.fsutil import resolve_in_root

log = logging.getLogger(__name__)


def sources(context: Path, patterns: list[str]) -> list[Path]:
    """The context paths ``patterns`` name; each must lie inside ``context``."""
    base = context.resolve()
    found: list[Path] = []
    for pattern in patterns:
        if pattern.startswith("/") or ".." in Path(pattern).parts:
            raise ImageBuildError(f"COPY source {pattern!r} is outside the build context")
        matches = sorted(glob.glob(glob.escape(os.fspath(base)) + "/" + pattern))
        if not matches:
            raise ImageBuildError(f"COPY source {pattern!r} matches nothing in {context}")
        for match in matches:
            real = Path(match).resolve()
            if real != base and base not in real.parents:
                raise ImageBuildError(
                    f"COPY source {pattern!r} resolves outside the build context ({real})"
                )
            found.append(Path(match))
    return found


def copy_in(
    rootfs: Path, srcs: list[Path], dest: str, workdir: str, owner: tuple[int, int]
) -> None:
    """Copy ``srcs`` to ``dest`` (relative to ``workdir``) in ``rootfs``, owned by
    ``owner``. A directory's contents are copied, not the directory itself; several
    sources, or a dest ending in "/", make dest a directory."""
    target = dest if dest.startswith("/") else os.path.join(workdir, dest)
    into_dir = dest.endswith("/") or len(srcs) > 1 or any(s.is_dir() for s in srcs)
    where = resolve_in_root(rootfs, target)
    try:
        if into_dir:
            _mkdirs(rootfs, where, owner)
        else:
            _mkdirs(rootfs, where.parent, owner)
        for src in srcs:
            if src.is_dir():
                _copy_dir(rootfs, src, target, owner)
            else:
                final = where / src.name if into_dir else where
                _copy_file(src, final, owner)
    except OSError as exc:
        raise ImageBuildError(f"COPY to {dest}: {exc}") from exc


def _mkdirs(rootfs: Path, path: Path, owner: tuple[int, int]) -> None:
    missing: list[Path] = []
    probe = path
    while not probe.exists() and probe != rootfs:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        directory.mkdir(mode=0o755)
        os.lchown(directory, *owner)


def _copy_file(src: Path, final: Path, owner: tuple[int, int]) -> None:
    if final.is_symlink() or (final.exists() and not final.is_dir()):
        final.unlink()
    if src.is_symlink():
        os.symlink(os.readlink(src), final)
    else:
        shutil.copy2(src, final, follow_symlinks=True)
    os.lchown(final, *owner)


def _copy_dir(rootfs: Path, src: Path, target: str, owner: tuple[int, int]) -> None:
    """The contents of ``src`` into the image's directory ``target``; every directory
    resolved in the tree again (one of the image's own may be a symlink)."""
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        here = resolve_in_root(rootfs, target if rel == "." else os.path.join(target, rel))
        if not here.exists():
            here.mkdir()
            shutil.copystat(dirpath, here)
            os.lchown(here, *owner)
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        for name in filenames + links:
            _copy_file(Path(dirpath, name), here / name, owner)
        dirnames[:] = [d for d in dirnames if d not in links]
