"""The node's ends of a child's pipes, driven from the event loop, each descriptor
closed exactly once, here.

The loop's own pipe transports (``connect_read_pipe``, ``connect_write_pipe``) are not
used: uvloop's close a pipe's descriptor twice, once in libuv and once through the file
object they were given. Between the two, another thread of the node (a sandbox's
mounts, a jail's start, a ``subprocess.Popen``) may have been given the same number, and
the second close took that thread's descriptor from under it: its own ``close`` then
failed with EBADF, or worse, it wrote to a file it no longer had. ``PipeReader`` feeds
an ``asyncio.StreamReader`` (with its flow control: reading pauses while the reader
holds more than its limit, so a child that floods its output is held by the pipe, not
buffered by the node); ``PipeWriter`` takes what a ``StreamWriter`` would. Both serve a
terminal's master as well (``node.sandboxes.crun.spawn``): its EIO once the terminal's
last slave is closed is its end of file.
"""

from __future__ import annotations

import asyncio
import errno
import os
from typing import Any


class PipeReader(asyncio.ReadTransport):
    """Reads ``fd`` (a pipe's read end, now owned here) into ``reader`` until EOF."""

    CHUNK = 1 << 16

    def __init__(self, fd: int, reader: asyncio.StreamReader) -> None:
        super().__init__()
        os.set_blocking(fd, False)
        self._fd: int | None = fd
        self._reader = reader
        self._loop = asyncio.get_running_loop()
        self._paused = False
        reader.set_transport(self)
        self._loop.add_reader(fd, self._on_readable)

    def _on_readable(self) -> None:
        if self._fd is None:
            return
        try:
            data = os.read(self._fd, self.CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno == errno.EIO:  # a terminal's master: no slave is left open
                self._reader.feed_eof()
            else:
                self._reader.set_exception(exc)
            self.close()
            return
        if data:
            self._reader.feed_data(data)  # may pause us (the reader's flow control)
            return
        self._reader.feed_eof()
        self.close()

    def pause_reading(self) -> None:
        if self._fd is not None and not self._paused:
            self._paused = True
            self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if self._fd is not None and self._paused:
            self._paused = False
            self._loop.add_reader(self._fd, self._on_readable)

    def is_reading(self) -> bool:
        return self._fd is not None and not self._paused

    def is_closing(self) -> bool:
        return self._fd is None

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            if not self._paused:
                self._loop.remove_reader(fd)
            os.close(fd)

    def fileno(self) -> int:
        if self._fd is None:
            raise ValueError("the pipe is closed")
        return self._fd

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """``pipe``: this reader (its ``fileno()``), as a loop's pipe transport gives."""
        return self if name == "pipe" else default


class PipeWriter:
    """The node's end of a child's stdin: ``write``, ``drain``, ``close`` as on a
    ``StreamWriter``."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd: int | None = fd
        self._loop = asyncio.get_running_loop()
        self._pending = bytearray()
        self._waiters: list[asyncio.Future[None]] = []
        self._error: OSError | None = None
        self._closing = False

    def write(self, data: bytes) -> None:
        if self._error is not None:
            raise self._error
        if self._fd is None or self._closing:
            raise BrokenPipeError("the child's input is closed")
        if self._pending:
            self._pending += data
            return
        try:
            written = os.write(self._fd, data)
        except BlockingIOError:
            written = 0
        except OSError as exc:
            self._fail(exc)
            raise
        if written < len(data):
            self._pending += data[written:]
            self._loop.add_writer(self._fd, self._flush)

    def _flush(self) -> None:
        assert self._fd is not None
        try:
            written = os.write(self._fd, self._pending)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(exc)
            return
        del self._pending[:written]
        if not self._pending:
            self._loop.remove_writer(self._fd)
            self._wake()
            if self._closing:
                self._close_now()

    async def drain(self) -> None:
        while self._pending and self._error is None:
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            await waiter
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Close once what was written has gone (at once if nothing waits)."""
        self._closing = True
        if not self._pending:
            self._close_now()

    def is_closing(self) -> bool:
        return self._closing or self._fd is None

    def fileno(self) -> int:
        if self._fd is None:
            raise ValueError("the pipe is closed")
        return self._fd

    def _fail(self, exc: OSError) -> None:
        self._error = exc
        self._pending.clear()
        self._close_now()
        self._wake()

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    def _close_now(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            self._loop.remove_writer(fd)
            os.close(fd)
