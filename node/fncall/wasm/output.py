"""Bounded capture of a guest's stdout or stderr: a pipe, or a WASI custom callback.

Both keep at most ``limit`` bytes of what the guest writes during its call and count the
rest, so a flood costs the guest time (bounded by its deadline) and the host no memory.

* ``PipeCapture``, for fresh instances: an ``OutputPipe`` (a FIFO) that WASI opens as the
  guest's output file (``stdout_file``), so each write is a ``write(2)`` on the guest's own
  thread, and that the worker's event loop drains (``add_reader``). When the guest has
  returned, all it wrote is in the pipe or already read, so ``collect()`` reads until the
  pipe is empty (``EAGAIN``, or a read shorter than asked) without waiting for the Store
  to close. A guest whose writes outrun the loop
  blocks in ``write`` until the loop drains.
* ``OutputPipes`` lends FIFOs to instances one at a time and takes them back, so a call
  does not make, open, watch, close and unlink two FIFOs (docs/benchmarks-history.md,
  "Issue 10, 2026-12-03, afternoon: output pipes lent, not made"). The worker holds a
  write end of each itself, so the read end never reads end-of-file and never wakes the
  loop for a hang-up. A pipe comes back only from an
  instance whose guest returned and was collected, after its Store (the guest's write end)
  is closed; before it is lent again, ``reusable()`` proves that nobody else writes to it
  (with the worker's own write end closed, a read returns end-of-file) and that nothing
  arrived after the collect. A pipe whose guest did not return (abandoned past its
  deadline) is retired at once: its read end is closed, so the guest's further writes get
  ``EPIPE``.
* ``OutputCapture``, for warm instances: wasmtime calls it with each write on one of its
  own (tokio) threads, which takes the GIL for every write; it serves warm instances
  because before ``arm()`` it is in warm-up mode, looking for the ready marker a
  bootstrap writes when it is about to wait for its program, and keeping nothing. For a
  small module's call it cost 0.3 ms and a dozen thread switches more than a pipe
  (docs/benchmarks-history.md, "Output through a pipe").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

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

    def release(self) -> None: ...


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


class OutputPipe:
    """A FIFO the worker keeps open at both ends, its read end watched by the event loop
    for as long as the pipe lives; what it reads goes to the borrower's ``Kept``."""

    def __init__(self, path: Path, loop: asyncio.AbstractEventLoop) -> None:
        self.path = path
        self._loop = loop
        self.kept: Kept | None = None  #: the borrower's, while lent and not collected
        self.stray = 0  #: bytes read while nobody borrowed it
        self._keeper: int | None = None
        os.mkfifo(path, 0o600)
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            self._keeper = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            loop.add_reader(self._fd, self.drain, READS_PER_WAKEUP)
        except BaseException:
            self.close()
            raise

    @property
    def closed(self) -> bool:
        return self._fd is None

    def drain(self, reads: int) -> None:
        """Read at most ``reads`` chunks, until the pipe is empty (event loop thread). A
        read shorter than a chunk emptied the pipe (a pipe's read returns all it holds,
        up to the size asked), so no read is made just to see ``EAGAIN``."""
        fd = self._fd
        while fd is not None and reads > 0:
            try:
                data = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                return
            except OSError:
                self.close()
                return
            if not data:  # only when the worker's own write end is closed
                return
            kept = self.kept
            if kept is not None:
                kept.add(data)
            else:
                self.stray += len(data)
            if len(data) < READ_CHUNK:
                return
            reads -= 1

    def reusable(self) -> bool:
        """Whether the pipe can be lent again: nothing arrived since its last borrower was
        collected, and no write end is open but the worker's own (with that one closed, a
        read returns end-of-file, not ``EAGAIN``). Event loop thread; a pipe found not
        reusable must be closed."""
        fd = self._fd
        if fd is None or self._keeper is None or self.stray:
            return False
        os.close(self._keeper)
        self._keeper = None
        try:
            data = os.read(fd, 1)
        except OSError:  # EAGAIN: some other write end is still open
            return False
        if data:
            self.stray += len(data)
            return False
        try:
            self._keeper = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # out of descriptors: without a writer its read end would hang up
            return False
        return True

    def close(self) -> None:
        """Stop reading, close both ends, unlink the FIFO (event loop thread). A guest still
        writing gets ``EPIPE``. Idempotent."""
        fd, self._fd = self._fd, None
        keeper, self._keeper = self._keeper, None
        self.kept = None
        if fd is not None:
            self._loop.remove_reader(fd)
            os.close(fd)
        if keeper is not None:
            os.close(keeper)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class OutputPipes:
    """The worker's output FIFOs, lent to fresh instances one at a time (see the module's
    docstring). ``take`` and ``close`` run on the event loop's thread, ``give`` on any."""

    def __init__(self, directory: Path, loop: asyncio.AbstractEventLoop, *, keep: int) -> None:
        self._dir = directory
        self._loop = loop
        self._keep = keep  #: free pipes kept at most
        self._names = itertools.count(1)
        self._free: list[OutputPipe] = []
        self._returned: collections.deque[OutputPipe] = collections.deque()
        self._made: set[OutputPipe] = set()  #: every pipe not yet closed
        self.retired = 0  #: pipes given back that could not be lent again

    def take(self) -> OutputPipe:
        self._sort_returned()
        if self._free:
            return self._free.pop()
        pipe = OutputPipe(self._dir / f"o{next(self._names)}", self._loop)
        self._made.add(pipe)
        return pipe

    def give(self, pipe: OutputPipe) -> None:
        """Take back a pipe whose borrower was collected and whose Store is closed."""
        self._returned.append(pipe)

    def retire(self, pipe: OutputPipe) -> None:
        pipe.close()
        self._made.discard(pipe)

    def _sort_returned(self) -> None:
        while self._returned:
            pipe = self._returned.popleft()
            if len(self._free) < self._keep and pipe.reusable():
                self._free.append(pipe)
                continue
            if pipe.stray:
                log.warning(
                    "wasm output pipe %s: %d bytes after its guest returned; retired",
                    pipe.path.name,
                    pipe.stray,
                )
            self.retired += 1
            self.retire(pipe)

    @property
    def open_count(self) -> int:
        return len(self._made)

    def close(self) -> None:
        """Close every pipe, lent or not (the executor closes after its instances)."""
        self._returned.clear()
        self._free.clear()
        for pipe in list(self._made):
            self.retire(pipe)


class PipeCapture:
    """A fresh instance's stdout or stderr: an ``OutputPipe`` borrowed from ``pipes``."""

    def __init__(self, pipes: OutputPipes) -> None:
        self._pipes = pipes
        self.kept = Kept()
        self._pipe: OutputPipe | None = pipes.take()
        self._pipe.kept = self.kept
        self.path = self._pipe.path  #: for WASI to open as the guest's output file
        self._collected = False

    def arm(self, limit: int) -> None:
        self.kept.limit = limit

    def collect(self) -> None:
        """Read what is left (the guest has returned: nothing more is coming)."""
        pipe = self._pipe
        if pipe is None or self._collected:
            return
        pipe.drain(COLLECT_READS)
        pipe.kept = None
        self._collected = not pipe.closed

    def close(self) -> None:
        """Stop keeping output (event loop thread, at dispose). A pipe not collected (its
        guest never returned) is retired now. Idempotent."""
        pipe = self._pipe
        if pipe is None or self._collected:
            return
        self._pipe = None
        pipe.kept = None
        self._pipes.retire(pipe)

    def release(self) -> None:
        """The guest's Store is closed: a collected pipe goes back to be lent again."""
        pipe, self._pipe = self._pipe, None
        if pipe is not None and self._collected:
            self._pipes.give(pipe)

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

    def release(self) -> None:
        """Nothing to give back."""
