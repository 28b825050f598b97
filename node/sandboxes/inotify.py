"""inotify on directories of sandboxes (the crun backend's ``watch_dir``): one inotify
instance for the whole node, one watch in it per directory.

Every watch used to make an inotify instance of its own, and the node is host root: one
tenant's 128 watchers took the host's ``fs.inotify.max_user_instances``, after which
every other tenant's watch, and every other root process on the host that needs inotify,
failed (security review, finding #4). Now the node holds one instance (``Inotify``, made
with the first watch, closed with the last) and adds a watch to it per directory: the
limit that applies is ``max_user_watches`` (hundreds of thousands), and the watcher table
(``node.sandboxes.watch``) caps watches per sandbox, per tenant and per node. Events
are dispatched by watch descriptor. Two watches of the same directory share the
kernel's watch (inotify has one per inode and instance), removed when the last of them
closes.

A watch is set on a descriptor the backend resolved inside the sandbox's root, reached
as ``/proc/self/fd/N`` at the moment it is added (the kernel then watches the inode; the
descriptor is not kept): a symlink planted in the sandbox cannot point the node's inotify
at a host path. The kernel reports changes the sandbox's processes make as well as the
node's own file operations (the host's view of the sandbox's root is the same mount).
Events wait in each watch, at most ``MAX_EVENTS`` (more are counted as dropped), until
drained; an overflow of the instance's queue counts as dropped in every watch. When the
kernel refuses (no instance or no watch left: ``EMFILE``, ``ENFILE``, ``ENOSPC``,
``ENOMEM``) the watch fails with ``WatchesExhausted`` (503 ``no_capacity``), not a bare
``OSError``.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import struct
from typing import ClassVar

from node.sandboxes.base import (
    DirWatch,
    NotADirectory,
    PathNotFound,
    SandboxError,
)
from wire.sandboxes import FsEvent, FsEventType, WatchEvents

#: events kept per watch until drained (each a name of at most 255 bytes and a type)
MAX_EVENTS = 1_000

IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_UNMOUNT, IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR = 0x2000, 0x4000, 0x8000, 0x01000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
MASK = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
MASK |= IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
_ENDS = IN_IGNORED | IN_UNMOUNT | IN_DELETE_SELF | IN_MOVE_SELF
_KINDS = (
    (IN_CREATE | IN_MOVED_TO, FsEventType.CREATE),
    (IN_MODIFY, FsEventType.WRITE),
    (IN_DELETE, FsEventType.REMOVE),
    (IN_MOVED_FROM, FsEventType.RENAME),
    (IN_ATTRIB, FsEventType.CHMOD),
)
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len
#: the kernel is out of instances or watches: the node cannot watch more now
_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.ENOMEM}

_libc = ctypes.CDLL(None, use_errno=True)


class WatchesExhausted(SandboxError):
    status, code = 503, "no_capacity"


def _refused(err: int, call: str) -> Exception:
    if err in _EXHAUSTED:
        return WatchesExhausted(
            f"the node cannot watch another directory now ({call}: {os.strerror(err)})"
        )
    if err == errno.ENOTDIR:
        return NotADirectory("not a directory")
    if err == errno.ENOENT:
        return PathNotFound("the directory is gone")
    return OSError(err, call)


class Inotify:
    """The node's inotify instance and its watches, by watch descriptor."""

    _shared: ClassVar[Inotify | None] = None

    @classmethod
    def shared(cls) -> Inotify:
        """The instance of the running event loop's node (made if there is none)."""
        loop = asyncio.get_running_loop()
        current = cls._shared
        if current is None or current._fd is None or current._loop is not loop:
            current = cls._shared = cls(loop)
        return current

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise _refused(ctypes.get_errno(), "inotify_init1")
        self._fd: int | None = fd
        self._loop = loop
        self._watches: dict[int, set[InotifyWatch]] = {}
        loop.add_reader(fd, self._read)

    @property
    def fd(self) -> int | None:
        return self._fd

    def watching(self) -> int:
        """Kernel watches held (directories, each once)."""
        return len(self._watches)

    def add(self, directory_fd: int, watch: InotifyWatch) -> int:
        """Watch the directory open at ``directory_fd`` for ``watch``; its descriptor."""
        assert self._fd is not None
        target = f"/proc/self/fd/{directory_fd}".encode()
        wd = int(_libc.inotify_add_watch(self._fd, target, MASK))
        if wd < 0:
            err = ctypes.get_errno()
            if not self._watches:
                self._close()
            raise _refused(err, "inotify_add_watch")
        self._watches.setdefault(wd, set()).add(watch)
        return wd

    def remove(self, wd: int, watch: InotifyWatch) -> None:
        """``watch`` is done; the kernel's watch goes with the last of its directory's,
        the instance with the last watch."""
        watches = self._watches.get(wd)
        if watches is not None:
            watches.discard(watch)
            if not watches:
                del self._watches[wd]
                if self._fd is not None:
                    _libc.inotify_rm_watch(self._fd, wd)  # EINVAL if the kernel dropped it
        if not self._watches:
            self._close()

    def _close(self) -> None:
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None

    def _read(self) -> None:
        if self._fd is None:
            return
        try:
            data = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return
        at = 0
        while at + _HEADER.size <= len(data):
            wd, mask, _cookie, size = _HEADER.unpack_from(data, at)
            raw = data[at + _HEADER.size : at + _HEADER.size + size]
            at += _HEADER.size + size
            if mask & IN_Q_OVERFLOW:
                for watches in self._watches.values():
                    for watch in watches:
                        watch.dropped += 1
                continue
            found = self._watches.get(wd)
            if not found:
                continue
            if mask & _ENDS:
                for watch in found:
                    watch.ended = True
                if mask & IN_IGNORED:  # the kernel removed the watch itself
                    del self._watches[wd]
                continue
            name = raw.split(b"\0", 1)[0].decode(errors="replace")
            if not name:
                continue
            for bits, kind in _KINDS:
                if mask & bits:
                    for watch in found:
                        watch.add(name, kind)


class InotifyWatch(DirWatch):
    """One directory watched in the node's inotify instance; events wait here until
    ``drain``."""

    def __init__(self, directory_fd: int) -> None:
        """Watch the directory open at ``directory_fd`` (the caller keeps and closes it:
        the kernel watches the inode)."""
        self._events: list[tuple[str, FsEventType]] = []
        self.dropped = 0
        self.ended = False
        inotify = Inotify.shared()
        self._wd = inotify.add(directory_fd, self)
        self._inotify: Inotify | None = inotify

    def add(self, name: str, kind: FsEventType) -> None:
        if len(self._events) >= MAX_EVENTS:
            self.dropped += 1
        else:
            self._events.append((name, kind))

    def drain(self) -> WatchEvents:
        events, self._events = self._events, []
        dropped, self.dropped = self.dropped, 0
        return WatchEvents(
            events=[FsEvent(name=name, type=kind) for name, kind in events],
            dropped=dropped,
            ended=self.ended,
        )

    def close(self) -> None:
        inotify, self._inotify = self._inotify, None
        if inotify is not None:
            inotify.remove(self._wd, self)
