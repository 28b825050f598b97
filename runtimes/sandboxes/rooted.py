"""File operations inside a sandbox's root filesystem, done by the host, that cannot leave it.

The sandbox's code controls every name in its tree: a symlink ``/home/user/x ->
/etc/shadow`` or ``-> ../../../../`` must mean the sandbox's ``/etc/shadow`` and its own
root, never the host's. Every path is therefore opened with ``openat2(2)`` and
``RESOLVE_IN_ROOT`` (the kernel resolves ``..`` and absolute symlinks as if the
sandbox's root were ``/``) and ``RESOLVE_NO_MAGICLINKS`` (no ``/proc/*/fd`` jumps); the
last component is then acted on relative to its parent's descriptor, never by a host
path. Files are opened ``O_NONBLOCK`` and checked to be regular, so a FIFO planted where
a file is read cannot stall the node. All of it is blocking: callers run it in a thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import posixpath
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from runtimes.sandboxes.base import (
    FileTooLarge,
    NotADirectory,
    PathExists,
    PathNotFound,
    SandboxPathError,
)
from wire.sandboxes import FileEntry, FileType

_SYS_OPENAT2 = 437  # x86_64 and aarch64
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
_RESOLVE = _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS
_libc = ctypes.CDLL(None, use_errno=True)
MAX_PATH_BYTES = 4096


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


def normalise(path: str, *, home: str = "/") -> str:
    """An absolute, normalised path inside the sandbox (relative ones are from ``home``)."""
    if not path or "\x00" in path or len(path.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        raise SandboxPathError(f"invalid path {path!r}")
    joined = posixpath.normpath(posixpath.join(home, path))
    return "/" + joined.lstrip("/")  # normpath keeps a leading "//"


def _raise_for(exc: OSError, path: str) -> None:
    if exc.errno == errno.ENOENT:
        raise PathNotFound(f"no such file or directory: {path}") from exc
    if exc.errno == errno.EEXIST:
        raise PathExists(f"already exists: {path}") from exc
    if exc.errno == errno.ENOTDIR:
        raise NotADirectory(f"not a directory: {path}") from exc
    if exc.errno == errno.EISDIR:
        raise SandboxPathError(f"is a directory: {path}") from exc
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise SandboxPathError(f"the sandbox's disk is full: {path}") from exc
    if exc.errno in (errno.ELOOP, errno.EXDEV, errno.EACCES, errno.EPERM):
        raise SandboxPathError(f"{path}: {exc.strerror}") from exc
    raise SandboxPathError(f"{path}: {exc.strerror or exc}") from exc


#: how an id outside a user namespace's map reads inside it
OVERFLOW_ID = 65534


class RootedFS:
    """The tree under ``root`` (a sandbox's mounted root filesystem), seen from inside.

    ``id_offset``: the host id of the sandbox's id 0 (its user namespace's range): owners
    are given and reported as the sandbox's own ids."""

    def __init__(self, root: Path, *, id_offset: int = 0) -> None:
        self.root = root
        self.id_offset = id_offset

    def _inner(self, host_id: int) -> int:
        inner = host_id - self.id_offset
        return inner if 0 <= inner < 65536 or not self.id_offset else OVERFLOW_ID

    @contextlib.contextmanager
    def _root_fd(self) -> Iterator[int]:
        try:
            fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise PathNotFound(f"the sandbox's root is gone: {exc.strerror}") from exc
        try:
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _open(self, path: str, flags: int, mode: int = 0) -> Iterator[int]:
        with self._root_fd() as root:
            try:
                fd = openat2(root, path, flags, mode)
            except OSError as exc:
                _raise_for(exc, path)
                raise  # unreachable
        try:
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def directory(self, path: str) -> Iterator[int]:
        """An ``O_PATH`` descriptor of the directory ``path``, resolved inside the root
        (for the kernel to reach it by, as ``/proc/self/fd/N``, without a host path)."""
        with self._open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) as fd:
            yield fd

    @contextlib.contextmanager
    def _parent(self, path: str) -> Iterator[tuple[int, str]]:
        if path == "/":
            raise SandboxPathError("the sandbox's root itself cannot be changed or removed")
        parent, name = posixpath.split(path)
        with self._open(parent, os.O_PATH | os.O_DIRECTORY) as fd:
            yield fd, name

    # --- reading --------------------------------------------------------------------
    def read(self, path: str, *, max_bytes: int) -> bytes:
        with self._open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY) as fd:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise SandboxPathError(f"is a directory: {path}")
            if not stat.S_ISREG(info.st_mode):
                raise SandboxPathError(f"not a regular file: {path}")
            if info.st_size > max_bytes:
                raise FileTooLarge(f"{path} is {info.st_size} bytes; at most {max_bytes} are read")
            chunks: list[bytes] = []
            total = 0
            while chunk := os.read(fd, 1 << 20):
                total += len(chunk)
                if total > max_bytes:  # grew while read
                    raise FileTooLarge(f"{path} is over {max_bytes} bytes")
                chunks.append(chunk)
            return b"".join(chunks)

    def stat(self, path: str) -> FileEntry:
        if path == "/":
            with self._root_fd() as root:
                return self._entry(os.fstat(root), "/", None)
        with self._parent(path) as (parent, name):
            try:
                info = os.stat(name, dir_fd=parent, follow_symlinks=False)
                target = os.readlink(name, dir_fd=parent) if stat.S_ISLNK(info.st_mode) else None
            except OSError as exc:
                _raise_for(exc, path)
                raise
            return self._entry(info, path, target)

    def list_dir(self, path: str, *, depth: int = 1) -> list[FileEntry]:
        entries: list[FileEntry] = []
        self._walk(path, depth, entries)
        return entries

    def _walk(self, path: str, depth: int, out: list[FileEntry]) -> None:
        with self._open(path, os.O_RDONLY | os.O_DIRECTORY) as fd:
            info = os.fstat(fd)
            if not stat.S_ISDIR(info.st_mode):
                raise NotADirectory(f"not a directory: {path}")
            subdirs: list[str] = []
            with os.scandir(fd) as it:
                for item in sorted(it, key=lambda e: e.name):
                    child = posixpath.join(path, item.name)
                    try:
                        info = os.stat(item.name, dir_fd=fd, follow_symlinks=False)
                        target = (
                            os.readlink(item.name, dir_fd=fd)
                            if stat.S_ISLNK(info.st_mode)
                            else None
                        )
                    except OSError:
                        continue  # removed meanwhile
                    out.append(self._entry(info, child, target))
                    if stat.S_ISDIR(info.st_mode):
                        subdirs.append(child)
        if depth > 1:
            for child in subdirs:
                with contextlib.suppress(PathNotFound, NotADirectory):
                    self._walk(child, depth - 1, out)

    # --- writing --------------------------------------------------------------------
    def write(self, path: str, data: bytes, *, owner: Account, mode: int = 0o644) -> FileEntry:
        parent = posixpath.dirname(path)
        self.make_dirs(parent, owner=owner, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_NOCTTY
        with self._open(path, flags, mode) as fd:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SandboxPathError(f"not a regular file: {path}")
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fchown(fd, owner.uid + self.id_offset, owner.gid + self.id_offset)
            except OSError as exc:
                _raise_for(exc, path)
            return self._entry(os.fstat(fd), path, None)

    def make_dirs(self, path: str, *, owner: Account, exist_ok: bool) -> FileEntry:
        parts = [p for p in path.split("/") if p]
        made = False
        for i in range(len(parts)):
            prefix = "/" + "/".join(parts[: i + 1])
            try:
                with self._open(prefix, os.O_PATH | os.O_DIRECTORY):
                    continue
            except PathNotFound:
                pass
            with self._parent(prefix) as (parent, name):
                try:
                    os.mkdir(name, 0o755, dir_fd=parent)
                    os.chown(
                        name,
                        owner.uid + self.id_offset,
                        owner.gid + self.id_offset,
                        dir_fd=parent,
                        follow_symlinks=False,
                    )
                    made = True
                except FileExistsError:
                    pass  # made meanwhile, or a non-directory: the next open says which
                except OSError as exc:
                    _raise_for(exc, prefix)
        if not made and not exist_ok and parts:
            raise PathExists(f"already exists: {path}")
        return self.stat(path or "/")

    def remove(self, path: str) -> None:
        with self._parent(path) as (parent, name):
            try:
                info = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    shutil.rmtree(name, dir_fd=parent)
                else:
                    os.unlink(name, dir_fd=parent)
            except OSError as exc:
                _raise_for(exc, path)

    def move(self, source: str, destination: str, *, owner: Account) -> FileEntry:
        self.make_dirs(posixpath.dirname(destination), owner=owner, exist_ok=True)
        with (
            self._parent(source) as (src_dir, src_name),
            self._parent(destination) as (
                dst_dir,
                dst_name,
            ),
        ):
            try:
                os.rename(src_name, dst_name, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
            except OSError as exc:
                _raise_for(exc, source)
        return self.stat(destination)

    # --- accounts -------------------------------------------------------------------
    def account(self, user: str) -> Account:
        """``root``, a user name from the sandbox's /etc/passwd, ``uid`` or ``uid:gid``."""
        users = self._passwd()
        if user.replace(":", "").isdigit():
            uid_s, _, gid_s = user.partition(":")
            uid = int(uid_s)
            known = next((a for a in users.values() if a.uid == uid), None)
            gid = int(gid_s) if gid_s else (known.gid if known else uid)
            return Account(known.name if known else uid_s, uid, gid, known.home if known else "/")
        if user in users:
            return users[user]
        if user == "root":
            return Account("root", 0, 0, "/root")
        raise SandboxPathError(f"no user {user!r} in the sandbox")

    def _passwd(self) -> dict[str, Account]:
        try:
            text = self.read("/etc/passwd", max_bytes=1 << 20).decode("utf-8", "replace")
        except (PathNotFound, SandboxPathError):
            return {}
        accounts: dict[str, Account] = {}
        for line in text.splitlines():
            fields = line.split(":")
            if len(fields) >= 6 and fields[2].isdigit() and fields[3].isdigit():
                accounts[fields[0]] = Account(fields[0], int(fields[2]), int(fields[3]), fields[5])
        return accounts

    def _entry(self, info: os.stat_result, path: str, target: str | None) -> FileEntry:
        mode = info.st_mode
        kind = (
            FileType.DIR
            if stat.S_ISDIR(mode)
            else FileType.FILE
            if stat.S_ISREG(mode)
            else FileType.SYMLINK
            if stat.S_ISLNK(mode)
            else FileType.OTHER
        )
        return FileEntry(
            name=posixpath.basename(path) or "/",
            path=path,
            type=kind,
            size=info.st_size,
            mode=stat.S_IMODE(mode),
            owner=str(self._inner(info.st_uid)),
            group=str(self._inner(info.st_gid)),
            modified_at=info.st_mtime,
            symlink_target=target,
        )
