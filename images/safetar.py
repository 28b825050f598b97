"""Unpacking a root filesystem tar without letting it write outside its directory.

The whole archive is checked before anything is written; it is refused (naming the
member) if a member's path is absolute or has a ``..`` component, a hard link points
outside the tree, a member lies below a symlink of the archive (writing through it could
land anywhere: symlinks are never followed when unpacking), or a symlink is later
overwritten by another member. Symlinks themselves may point anywhere (absolute targets
are normal in a root filesystem); device nodes, fifos, owners (numeric ids, never names
looked up on this host) and setuid bits are kept.
"""

from __future__ import annotations

import logging
import os
import posixpath
import tarfile
from pathlib import Path

from images.errors import ImageBuildError

log = logging.getLogger(__name__)


def _clean(name: str) -> str:
    """The member's path relative to the tree ("" for the tree itself), or a refusal."""
    if name.startswith("/"):
        raise ImageBuildError(f"refused: member {name!r} has an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ImageBuildError(f"refused: member {name!r} escapes the root ('..')")
    return "/".join(parts)


def check_members(members: list[tarfile.TarInfo]) -> None:
    """Refuse an archive that could write outside its tree (see the module doc)."""
    symlinks: set[str] = set()

    def through_symlink(path: str) -> str | None:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            if "/".join(parts[:i]) in symlinks:
                return "/".join(parts[:i])
        return None

    for member in members:
        path = _clean(member.name)
        via = through_symlink(path)
        if via is not None:
            raise ImageBuildError(
                f"refused: member {member.name!r} lies below the symlink {via!r} of the archive"
            )
        if path in symlinks:
            raise ImageBuildError(f"refused: member {member.name!r} overwrites a symlink")
        if member.islnk():
            target = _clean(member.linkname)
            if not target or target in symlinks or through_symlink(target) is not None:
                raise ImageBuildError(
                    f"refused: hard link {member.name!r} to {member.linkname!r} "
                    "(the root, or through a symlink)"
                )
        elif member.issym():
            symlinks.add(path)
        elif not (member.isfile() or member.isdir() or member.isdev()):
            raise ImageBuildError(f"refused: member {member.name!r} of unknown type")
        member.name = path or "."
        if member.islnk():
            member.linkname = _clean(member.linkname)


def unpack(archive: Path, dest: Path) -> int:
    """Unpack the tar (or .tar.gz, .tar.xz, .tar.bz2) ``archive`` into ``dest`` (an
    empty directory); returns the number of members."""
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            members = tar.getmembers()
            check_members(members)
            for member in members:
                if member.name == ".":
                    # The tree's own root: its owner and mode, nothing to create.
                    os.chown(dest, member.uid, member.gid)
                    os.chmod(dest, member.mode & 0o7777)
                    continue
                if member.islnk():
                    # Not through tarfile: it would chmod the shared inode to the
                    # link member's mode (a setuid binary's hard link resets it).
                    _keep(member, os.fspath(dest))
                    target = os.path.join(dest, member.name)
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    if os.path.lexists(target):
                        os.unlink(target)
                    os.link(os.path.join(dest, member.linkname), target, follow_symlinks=False)
                    continue
                tar.extract(member, dest, numeric_owner=True, filter=_keep)
            # Directories' modes and times again: extracting into them changed them.
            for member in members:
                if member.isdir() and member.name != ".":
                    path = os.path.join(dest, member.name)
                    os.chmod(path, member.mode & 0o7777)
                    os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ImageBuildError(f"cannot unpack {archive}: {exc}") from exc
    log.info("unpacked %d members of %s", len(members), archive)
    return len(members)


def _keep(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """Members were checked as a whole by ``check_members``; a last check per member
    that nothing already on disk (an earlier member) redirects it."""
    parent = posixpath.dirname(member.name)
    real_dest = os.path.realpath(dest)
    real_parent = os.path.realpath(os.path.join(dest, parent))
    if real_parent != real_dest and not real_parent.startswith(real_dest + os.sep):
        raise ImageBuildError(f"refused: member {member.name!r} would land outside the tree")
    return member
