"""File calls done inside a container sandbox by its own init, as the user they name.

The node never touches a sandbox's files itself. Each file call is one request to the
sandbox's ``corral-init`` over its spawn socket (``crun.spawn``), which forks a child that
keeps only that connection and the call's pipe, becomes the user before it touches any
file and never execs (node/sandboxes/guest/corral-init.c, "file operations", has the protocol).
So the kernel checks every permission and every symlink as that user would meet them,
inside the sandbox's mount namespace and root (nothing outside the sandbox is reachable),
and what the call costs (the tmpfs pages of an upload, its CPU, its pid) is charged to the
sandbox's cgroups. A file's bytes travel through a pipe in bounded chunks, whatever its
size; a listing comes a page at a time.

Everything that comes back is untrusted: records are bounded and parsed strictly, an
error is an errno mapped to the node's own errors (never the child's words), and every
wait has a timeout, so an init that is frozen, swamped or gone makes a clear error
(``SandboxUnresponsive``), never a hang. Nothing here kills anything: when the node gives
up it closes its ends, and the child meets a broken pipe or an early end and exits.
"""

from __future__ import annotations

import array
import asyncio
import base64
import binascii
import contextlib
import errno
import fcntl
import logging
import os
import posixpath
import socket
import stat
import struct
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path

from node.sandboxes.base import (
    DiskFull,
    FileStream,
    FileTooLarge,
    NotADirectory,
    PathExists,
    PathNotFound,
    PermissionDenied,
    SandboxError,
    SandboxNotRunning,
    SandboxPathError,
    SandboxUnresponsive,
    Unsupported,
)
from node.sandboxes.crun.spawn import short_address
from node.sandboxes.rooted import Account
from wire.sandboxes import EntryPage, FileEntry, FileType

log = logging.getLogger(__name__)

#: the longest wait for one answer of the sandbox's init (a metadata call's, a file's open)
ANSWER_S = 10.0
#: ... for a call that walks a tree (a page of a listing, a recursive remove)
WALK_S = 60.0
#: a transfer whose bytes stop moving this long is abandoned
STALL_S = 30.0
#: bytes read from (and the size of) a transfer's pipe at once
CHUNK_BYTES = 1 << 16
NOT_REGULAR = 1000  #: corral-init's errno for "not a regular file (never opened)"
MAX_PATH = 4096
_ENTRY = struct.Struct("<BIIIqqIHH")
_HEAD = struct.Struct("<cI")
_U64 = struct.Struct("<Q")
_ERRNO = struct.Struct("<i")
MAX_RECORD = _ENTRY.size + 2 * MAX_PATH
_TYPES = {0: FileType.OTHER, 1: FileType.FILE, 2: FileType.DIR, 3: FileType.SYMLINK}


class _Unreadable(SandboxUnresponsive):
    """An answer that does not parse (only a broken or subverted child sends one)."""


def _error(err: int, path: str, other: str | None = None) -> SandboxError:
    """The node's error for an errno the child answered about ``path`` (or ``other``)."""
    about = path if other is None else f"{path} -> {other}"
    simple: dict[int, type[SandboxError]] = {
        errno.ENOENT: PathNotFound,
        errno.EEXIST: PathExists,
        errno.ENOTEMPTY: PathExists,
        errno.ENOTDIR: NotADirectory,
        errno.EACCES: PermissionDenied,
        errno.EPERM: PermissionDenied,
        errno.EROFS: PermissionDenied,
    }
    if err in simple:
        return simple[err](f"{_STRERROR.get(err, os.strerror(err)).lower()}: {about}")
    if err in (errno.ENOSPC, errno.EDQUOT, errno.ENOMEM):
        return DiskFull("the sandbox's disk (or the memory it counts against) is full")
    if err == errno.EFBIG:
        return FileTooLarge(f"{about} is over the largest file a call moves")
    if err == NOT_REGULAR:
        return SandboxPathError(f"not a regular file: {about}")
    if 0 < err < 4096:
        return SandboxPathError(f"{about}: {os.strerror(err)}")
    return _Unreadable(f"the sandbox's init answered an unknown error about {about}")


_STRERROR = {
    errno.ENOENT: "No such file or directory",
    errno.EEXIST: "Already exists",
    errno.ENOTEMPTY: "Already exists (a directory that is not empty)",
    errno.EACCES: "Permission denied",
    errno.EPERM: "Permission denied",
    errno.EROFS: "Permission denied (a read-only file system)",
}


def encode_cursor(relative: bytes) -> str:
    return base64.urlsafe_b64encode(relative).rstrip(b"=").decode()


def decode_cursor(cursor: str, *, depth: int) -> bytes:
    """A page's cursor as the path (relative to the listed directory) to start after."""
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the cursor is not one a listing gave") from None
    if not _relative_ok(raw, depth):
        raise ValueError("the cursor is not one a listing gave")
    return raw


def _relative_ok(raw: bytes, depth: int) -> bool:
    parts = raw.split(b"/")
    return (
        0 < len(raw) < MAX_PATH
        and b"\0" not in raw
        and len(parts) <= depth
        and all(p not in (b"", b".", b"..") for p in parts)
    )


def _entry(payload: bytes, base: str, depth: int) -> tuple[FileEntry, bytes]:
    """An 'S' record as an entry (its path: ``base``, or below it within ``depth``) and
    its raw relative path."""
    if len(payload) < _ENTRY.size:
        raise _Unreadable("the sandbox's init answered a short entry")
    kind, mode, uid, gid, size, mtime_s, mtime_ns, path_len, target_len = _ENTRY.unpack_from(
        payload
    )
    if (
        len(payload) != _ENTRY.size + path_len + target_len
        or kind not in _TYPES
        or path_len >= MAX_PATH
        or target_len >= MAX_PATH
        or size < 0
        or mtime_ns >= 1_000_000_000
    ):
        raise _Unreadable("the sandbox's init answered an entry that does not parse")
    relative = payload[_ENTRY.size : _ENTRY.size + path_len]
    target = payload[_ENTRY.size + path_len :]
    if relative and not _relative_ok(relative, depth):
        raise _Unreadable("the sandbox's init answered a path outside the call's")
    path = posixpath.join(base, relative.decode("utf-8", "replace")) if relative else base
    entry = FileEntry(
        name=posixpath.basename(path) or "/",
        path=path,
        type=_TYPES[kind],
        size=size,
        mode=stat.S_IMODE(mode),
        owner=str(uid),
        group=str(gid),
        modified_at=mtime_s + mtime_ns / 1e9,
        symlink_target=target.decode("utf-8", "replace") if kind == 3 else None,
    )
    return entry, relative


def _encoded(path: str) -> bytes:
    try:
        data = path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise SandboxPathError(f"invalid path {path!r}") from None
    if not data.startswith(b"/") or b"\0" in data or len(data) >= MAX_PATH:
        raise SandboxPathError(f"invalid path {path!r}")
    return data


class _Call:
    """One file call: its connection to the sandbox's init, and the answers on it."""

    def __init__(self, sock: socket.socket, sandbox_id: str) -> None:
        self._sock = sock
        self._sandbox_id = sandbox_id
        self._buffer = bytearray()

    @classmethod
    async def start(
        cls, socket_path: Path, sandbox_id: str, fields: list[bytes], fd: int | None = None
    ) -> _Call:
        """Send the request (``fd`` goes with it) to the init listening at ``socket_path``."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.setblocking(False)
        try:
            with short_address(socket_path) as address:
                async with asyncio.timeout(ANSWER_S):
                    await loop.sock_connect(sock, address)
            body = b"".join(f + b"\0" for f in [b"file", *fields])
            message = struct.pack("<I", len(body)) + body
            rights = (
                []
                if fd is None
                else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
            )
            sent = sock.sendmsg([message], rights)
            if sent < len(message):
                async with asyncio.timeout(ANSWER_S):
                    await loop.sock_sendall(sock, message[sent:])
        except FileNotFoundError:
            sock.close()
            raise Unsupported(
                f"sandbox {sandbox_id} was made before file calls ran inside sandboxes: "
                "make a new one"
            ) from None
        except (ConnectionRefusedError, ConnectionResetError, BrokenPipeError):
            sock.close()
            raise SandboxNotRunning(
                f"sandbox {sandbox_id} is not running (its init is gone)"
            ) from None
        except TimeoutError:
            sock.close()
            raise SandboxUnresponsive(
                f"sandbox {sandbox_id}'s init did not take the call within {ANSWER_S:g} s"
            ) from None
        except BaseException:
            sock.close()
            raise
        return cls(sock, sandbox_id)

    def close(self) -> None:
        self._sock.close()

    async def _more(self) -> None:
        data = await asyncio.get_running_loop().sock_recv(self._sock, 1 << 16)
        if not data:
            raise SandboxUnresponsive(
                f"sandbox {self._sandbox_id}'s init ended the call without an answer "
                "(the sandbox may be out of memory or processes)"
            )
        self._buffer += data

    async def record(self, timeout_s: float) -> tuple[bytes, bytes]:
        """The next answer: its tag and its bytes."""
        try:
            async with asyncio.timeout(timeout_s):
                while len(self._buffer) < _HEAD.size:
                    await self._more()
                tag, length = _HEAD.unpack_from(self._buffer)
                if length > MAX_RECORD:
                    raise _Unreadable("the sandbox's init answered an oversized record")
                while len(self._buffer) < _HEAD.size + length:
                    await self._more()
        except TimeoutError:
            raise SandboxUnresponsive(
                f"sandbox {self._sandbox_id}'s init did not answer within {timeout_s:g} s"
            ) from None
        payload = bytes(self._buffer[_HEAD.size : _HEAD.size + length])
        del self._buffer[: _HEAD.size + length]
        return tag, payload

    async def descriptor(self, timeout_s: float) -> tuple[bytes, bytes, int | None]:
        """The next answer, and the descriptor that came with it (if any)."""
        loop = asyncio.get_running_loop()
        fds: list[int] = []
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    try:
                        data, ancillary, flags, _ = self._sock.recvmsg(
                            _HEAD.size, socket.CMSG_SPACE(4 * 4), socket.MSG_CMSG_CLOEXEC
                        )
                        break
                    except BlockingIOError:
                        await _ready(loop, self._sock.fileno(), reading=True)
        except TimeoutError:
            raise SandboxUnresponsive(
                f"sandbox {self._sandbox_id}'s init did not answer within {timeout_s:g} s"
            ) from None
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % 4
                fds.extend(array.array("i", payload[:usable]))
        if len(fds) > 1 or flags & socket.MSG_CTRUNC:
            for fd in fds:
                os.close(fd)
            raise _Unreadable("the sandbox's init sent descriptors it was not asked for")
        self._buffer += data
        try:
            tag, payload = await self.record(timeout_s)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return tag, payload, fds[0] if fds else None

    async def send(self, data: bytes) -> None:
        async with asyncio.timeout(ANSWER_S):
            await asyncio.get_running_loop().sock_sendall(self._sock, data)

    def failure(
        self, tag: bytes, payload: bytes, path: str, other: str | None = None
    ) -> SandboxError:
        """The error an answer other than the one expected means."""
        if tag == b"E" and not payload:
            return SandboxUnresponsive(
                f"sandbox {self._sandbox_id}'s init cannot start a call now "
                "(its processes may be at their limit)"
            )
        if tag == b"E" and len(payload) == _ERRNO.size:
            return _error(_ERRNO.unpack(payload)[0], path, other)
        return _Unreadable(f"sandbox {self._sandbox_id}'s init answered out of turn")


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, *, reading: bool) -> None:
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    (loop.add_reader if reading else loop.add_writer)(fd, wake)
    try:
        await ready
    finally:
        (loop.remove_reader if reading else loop.remove_writer)(fd)


async def _read_some(fd: int, timeout_s: float) -> bytes:
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                return os.read(fd, CHUNK_BYTES)
            except BlockingIOError:
                await _ready(loop, fd, reading=True)


async def _write_all(fd: int, data: bytes, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    async with asyncio.timeout(timeout_s):
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                await _ready(loop, fd, reading=False)


def _pipe() -> tuple[int, int]:
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, CHUNK_BYTES)
    return read_end, write_end


class InitFileStream(FileStream):
    """A file the sandbox's init is reading into a pipe."""

    def __init__(self, call: _Call, fd: int, size: int, max_bytes: int, path: str) -> None:
        self.size = size
        self._call: _Call | None = call
        self._fd = fd
        self._max_bytes = max_bytes
        self._path = path

    async def chunks(self) -> AsyncIterator[bytes]:
        call = self._call
        if call is None:
            raise SandboxError(f"{self._path} was already read")
        total = 0
        try:
            while True:
                try:
                    data = await _read_some(self._fd, STALL_S)
                except TimeoutError:
                    raise SandboxUnresponsive(f"reading {self._path} stalled") from None
                if not data:
                    break
                total += len(data)
                if total > self._max_bytes:
                    raise FileTooLarge(f"{self._path} grew past {self._max_bytes} bytes")
                yield data
            tag, payload = await call.record(ANSWER_S)
            if tag != b"D" or payload != _U64.pack(total):
                raise call.failure(tag, payload, self._path)
        finally:
            await self.close()

    async def close(self) -> None:
        if self._call is not None:
            self._call.close()
            self._call = None
            os.close(self._fd)


class InitFiles:
    """The file calls of one sandbox, made by its init (listening at ``socket_path``)."""

    def __init__(self, socket_path: Path, sandbox_id: str) -> None:
        self._socket = socket_path
        self._sandbox_id = sandbox_id

    async def _start(
        self, op: bytes, who: Account, args: list[bytes], fd: int | None = None
    ) -> _Call:
        fields = [op, str(who.uid).encode(), str(who.gid).encode(), *args]
        return await _Call.start(self._socket, self._sandbox_id, fields, fd)

    async def _entry_call(
        self, op: bytes, who: Account, paths: list[str], *, walks: bool = False
    ) -> FileEntry:
        """A call that answers one entry (of its last path)."""
        call = await self._start(op, who, [_encoded(p) for p in paths])
        try:
            tag, payload = await call.record(WALK_S if walks else ANSWER_S)
            if tag != b"S":
                raise call.failure(tag, payload, paths[0], paths[1] if len(paths) > 1 else None)
            return _entry(payload, paths[-1], 0)[0]
        finally:
            call.close()

    async def read(self, path: str, who: Account, *, max_bytes: int) -> InitFileStream:
        read_end, write_end = _pipe()
        try:
            call = await self._start(
                b"read", who, [_encoded(path), str(max_bytes).encode()], write_end
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        try:
            tag, payload = await call.record(ANSWER_S)
            if tag != b"O" or len(payload) != _U64.size:
                raise call.failure(tag, payload, path)
            os.set_blocking(read_end, False)
        except BaseException:
            call.close()
            os.close(read_end)
            raise
        return InitFileStream(call, read_end, _U64.unpack(payload)[0], max_bytes, path)

    async def write(
        self, path: str, who: Account, chunks: AsyncIterable[bytes], *, mode: int
    ) -> FileEntry:
        read_end, write_end = _pipe()
        try:
            call = await self._start(b"write", who, [_encoded(path), str(mode).encode()], read_end)
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        try:
            tag, payload = await call.record(ANSWER_S)
            if tag != b"O" or payload:
                raise call.failure(tag, payload, path)
            os.set_blocking(write_end, False)
            total, broken = 0, False
            async for chunk in chunks:
                try:
                    await _write_all(write_end, chunk, STALL_S)
                except BrokenPipeError:
                    broken = True  # the child stopped: its answer says why
                    break
                except TimeoutError:
                    raise SandboxUnresponsive(f"writing {path} stalled") from None
                total += len(chunk)
            os.close(write_end)
            write_end = -1
            if not broken:
                await call.send(b"C" + _U64.pack(total))
            tag, payload = await call.record(STALL_S)
            if tag != b"S" or broken:
                raise call.failure(tag, payload, path)
            return _entry(payload, path, 0)[0]
        finally:
            call.close()
            if write_end >= 0:
                os.close(write_end)

    async def stat(self, path: str, who: Account) -> FileEntry:
        return await self._entry_call(b"stat", who, [path])

    async def make_dir(self, path: str, who: Account) -> FileEntry:
        return await self._entry_call(b"mkdir", who, [path])

    async def move(self, source: str, destination: str, who: Account) -> FileEntry:
        return await self._entry_call(b"move", who, [source, destination], walks=True)

    async def remove(self, path: str, who: Account) -> None:
        call = await self._start(b"remove", who, [_encoded(path)])
        try:
            tag, payload = await call.record(WALK_S)
            if tag != b"D" or payload:
                raise call.failure(tag, payload, path)
        finally:
            call.close()

    async def list_page(
        self, path: str, who: Account, *, depth: int, limit: int, cursor: str | None
    ) -> EntryPage:
        after = decode_cursor(cursor, depth=depth) if cursor else b""
        args = [_encoded(path), str(depth).encode(), str(limit).encode(), after]
        call = await self._start(b"list", who, args)
        entries: list[FileEntry] = []
        last = b""
        try:
            while True:
                tag, payload = await call.record(WALK_S)
                if tag == b"S" and len(entries) < limit:
                    entry, last = _entry(payload, path, depth)
                    if not last:
                        raise _Unreadable("the sandbox's init listed the directory itself")
                    entries.append(entry)
                elif tag == b"D" and len(payload) == 1 and payload in (b"\0", b"\1"):
                    more = payload == b"\1" and bool(entries)
                    break
                else:
                    raise call.failure(tag, payload, path)
        finally:
            call.close()
        return EntryPage(entries=entries, next_cursor=encode_cursor(last) if more else None)

    async def read_small(self, path: str, who: Account, *, max_bytes: int) -> bytes:
        """A whole small file (for the node's own use: /etc/passwd, /etc/hosts)."""
        stream = await self.read(path, who, max_bytes=max_bytes)
        try:
            return b"".join([chunk async for chunk in stream.chunks()])
        finally:
            await stream.close()

    async def open_dir(self, path: str, who: Account) -> int:
        """A descriptor of the directory ``path``, opened for reading by ``who`` (the
        caller closes it)."""
        call = await self._start(b"opendir", who, [_encoded(path)])
        try:
            tag, payload, fd = await call.descriptor(ANSWER_S)
        finally:
            call.close()
        if tag != b"F" or payload or fd is None:
            if fd is not None:
                os.close(fd)
            raise call.failure(tag, payload, path)
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                raise _Unreadable("the sandbox's init sent a descriptor that is no directory")
        except BaseException:
            os.close(fd)
            raise
        return fd
