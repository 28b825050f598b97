"""Bounded capture of a guest's stdout or stderr: a pipe, or a WASI custom callback.

Both keep at most ``limit`` bytes of what the guest writes during its call and count the
rest, so a flood costs the guest time (bounded by its deadline) and the host no memory.

* ``PipeCapture``, for fresh instances: a FIFO that WASI opens as the guest's output file
  (``stdout_file``), so each write is a ``write(2)`` on the guest's own thread, and that
  the worker's event loop drains (``add_reader``). When the guest has returned, all it
  wrote is in the pipe or already read, so ``collect()`` reads to ``EAGAIN`` without
  waiting for the Store to close. A guest whose writes outrun the loop blocks in
  ``write`` until the loop drains; closing the read end (``close``, at dispose) turns its
  further writes into ``EPIPE``. The FIFO's name is unlinked once both ends are open.
* ``OutputCapture``, for warm instances: wasmtime calls it with each write on one of its
  own (tokio) threads, which takes the GIL for every write; it serves warm instances
  because before ``arm()`` it is in warm-up mode, looking for the ready marker a
  bootstrap writes when it is about to wait for its program, and keeping nothing. For a
  small module's call it cost 0.3 ms and a dozen thread switches more than a pipe
  (docs/benchmarks.md, "Output through a pipe").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

#: Bytes read per ``read(2)``, and reads per wake-up of the event loop (so that a guest
#: writing as fast as it can does not keep the loop in one callback).
READ_CHUNK = 1 << 16
READS_PER_WAKEUP = 16
#: Reads by ``collect``: far more than a pipe's buffer (64 KiB) holds once its writer is done
COLLECT_READS = 64


class Capture(Protocol):
    """What the executor reads of a guest's output, whichever way it was captured."""

    @property
    def truncated(self) -> bool: ...

    def text(self) -> str: ...

    def arm(self, limit: int) -> None: ...

    def collect(self) -> None: ...

    def close(self) -> None: ...


class Kept:
    """At most ``limit`` bytes of a stream, and how many bytes it had in all."""

    def __init__(self) -> None:
        self.limit = 0
        self.total = 0
        self._chunks: list[bytes] = []
        self._size = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.limit - self._size
        if room > 0:
            piece = data[:room]
            self._chunks.append(piece)
            self._size += len(piece)

    @property
    def truncated(self) -> bool:
        return self.total > self._size

    def text(self) -> str:
        return b"".join(self._chunks).decode("utf-8", errors="replace")


class PipeCapture:
    def __init__(self, directory: Path, name: str, loop: asyncio.AbstractEventLoop) -> None:
        """Make the FIFO ``directory/name`` and open its read end; ``path`` is for WASI to
        open, ``opened()`` unlinks it after."""
        self.path = directory / name
        self._loop = loop
        self.kept = Kept()
        os.mkfifo(self.path, 0o600)
        try:
            self._fd: int | None = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except BaseException:
            self.opened()
            raise
        loop.add_reader(self._fd, self._drain, READS_PER_WAKEUP)

    def opened(self) -> None:
        """The writer has opened the FIFO: its name is not needed any more."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def arm(self, limit: int) -> None:
        self.kept.limit = limit

    def collect(self) -> None:
        """Read what is left (the guest has returned: nothing more is coming), then close."""
        self._drain(COLLECT_READS)
        self.close()

    def close(self) -> None:
        """Stop reading and close the read end (on the event loop's thread). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        self._loop.remove_reader(fd)
        os.close(fd)
        self.opened()

    def _drain(self, reads: int) -> None:
        fd = self._fd
        while fd is not None and reads > 0:
            try:
                data = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                return
            except OSError:
                self.close()
                return
            if not data:  # every writer closed: the Store is gone
                self.close()
                return
            self.kept.add(data)
            reads -= 1

    @property
    def truncated(self) -> bool:
        return self.kept.truncated

    def text(self) -> str:
        return self.kept.text()


class OutputCapture:
    """A WASI custom output callback (see the module's docstring)."""

    def __init__(
        self, *, marker: bytes | None = None, on_marker: Callable[[], None] | None = None
    ) -> None:
        self._lock = threading.Lock()
        self.kept = Kept()
        self._armed = marker is None
        self._marker = marker
        self._on_marker = on_marker
        self._pending = b""  #: warm-up output, searched for the marker

    def arm(self, limit: int) -> None:
        """Start keeping output, up to ``limit`` bytes."""
        with self._lock:
            self.kept.limit = limit
            self._armed = True
            self._pending = b""

    def __call__(self, data: bytes) -> int:
        fire = False
        with self._lock:
            if not self._armed:
                if self._marker is not None:
                    # keep only a marker's worth of tail between writes
                    self._pending = (self._pending + data)[-(len(self._marker) + len(data)) :]
                    if self._marker in self._pending:
                        self._pending = b""
                        self._marker = None
                        fire = True
            else:
                self.kept.add(data)
        if fire and self._on_marker is not None:
            self._on_marker()
        return len(data)

    @property
    def truncated(self) -> bool:
        with self._lock:
            return self.kept.truncated

    def text(self) -> str:
        with self._lock:
            return self.kept.text()

    def collect(self) -> None:
        """Nothing to read: every write arrived through the callback."""

    def close(self) -> None:
        """Nothing to release."""
