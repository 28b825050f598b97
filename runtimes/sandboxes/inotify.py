"""inotify on one directory of a sandbox (the crun backend's ``watch_dir``).

Set on a descriptor the backend resolved inside the sandbox's root, reached as
``/proc/self/fd/N``: a symlink planted in the sandbox cannot point the node's inotify at
a host path. The kernel reports changes the sandbox's processes make as well as the node's
own file operations (the host's view of the sandbox's root is the same mount). Events wait
in the watch, at most ``MAX_EVENTS`` (more are counted as dropped), until drained.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import struct

from runtimes.sandboxes.base import DirWatch
from wire.sandboxes import FsEvent, FsEventType, WatchEvents

MAX_EVENTS = 10_000

IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_UNMOUNT, IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR = 0x2000, 0x4000, 0x8000, 0x01000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
MASK = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
MASK |= IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
_KINDS = (
    (IN_CREATE | IN_MOVED_TO, FsEventType.CREATE),
    (IN_MODIFY, FsEventType.WRITE),
    (IN_DELETE, FsEventType.REMOVE),
    (IN_MOVED_FROM, FsEventType.RENAME),
    (IN_ATTRIB, FsEventType.CHMOD),
)
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len

_libc = ctypes.CDLL(None, use_errno=True)


class InotifyWatch(DirWatch):
    """inotify on one directory; events wait here until ``drain``."""

    def __init__(self, directory_fd: int) -> None:
        """Watch the directory open at ``directory_fd`` (the caller keeps and closes it)."""
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        target = f"/proc/self/fd/{directory_fd}".encode()
        if _libc.inotify_add_watch(fd, target, MASK) < 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, "inotify_add_watch")
        self._fd: int | None = fd
        self._events: list[FsEvent] = []
        self.dropped = 0
        self.ended = False
        asyncio.get_running_loop().add_reader(fd, self._read)

    def _read(self) -> None:
        if self._fd is None:
            return
        try:
            data = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return
        at = 0
        while at + _HEADER.size <= len(data):
            _wd, mask, _cookie, size = _HEADER.unpack_from(data, at)
            raw = data[at + _HEADER.size : at + _HEADER.size + size]
            at += _HEADER.size + size
            if mask & IN_Q_OVERFLOW:
                self.dropped += 1
            if mask & (IN_IGNORED | IN_UNMOUNT | IN_DELETE_SELF | IN_MOVE_SELF):
                self.ended = True
            name = raw.split(b"\0", 1)[0].decode(errors="replace")
            for bits, kind in _KINDS:
                if name and mask & bits:
                    self._add(FsEvent(name=name, type=kind))

    def _add(self, event: FsEvent) -> None:
        if len(self._events) >= MAX_EVENTS:
            self.dropped += 1
        else:
            self._events.append(event)

    def drain(self) -> WatchEvents:
        events, self._events = self._events, []
        dropped, self.dropped = self.dropped, 0
        return WatchEvents(events=events, dropped=dropped, ended=self.ended)

    def close(self) -> None:
        if self._fd is not None:
            asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None
