"""Large files for the transfer tests, never held whole: bytes made chunk by chunk and
hashed as they are sent or received, and the process's peak resident memory while they
travel (the server runs in a thread of the test's process: gateway and node alike)."""

from __future__ import annotations

import hashlib
import io
import os
import threading
from collections.abc import Iterator
from types import TracebackType

#: a chunk of the bytes sent (each starts with its number: no two alike)
CHUNK = 1 << 20


def rss() -> int:
    """The resident memory of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Source(io.RawIOBase):
    """``size`` bytes made as they are read (a file object, as SDKs stream them), hashed
    as they go: ``digest()`` once read to the end."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size, self.sent = size, 0
        self._block = os.urandom(CHUNK)
        self._hash = hashlib.sha256()
        self._current = (-1, b"")

    def readable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> bytes:
        want = CHUNK if n is None or n < 0 else min(n, CHUNK)
        left = self.size - self.sent
        if left <= 0:
            return b""
        number, at = divmod(self.sent, CHUNK)
        if self._current[0] != number:
            self._current = (number, number.to_bytes(8, "big") + self._block[8:])
        piece = self._current[1][at : at + min(want, left, CHUNK - at)]
        self.sent += len(piece)
        self._hash.update(piece)
        return piece

    def chunks(self) -> Iterator[bytes]:
        while piece := self.read(CHUNK):
            yield piece

    def digest(self) -> str:
        assert self.sent == self.size
        return self._hash.hexdigest()


class Sink:
    """Bytes received, hashed and counted, never kept (a binary file object's ``write``)."""

    def __init__(self) -> None:
        self.size = 0
        self._hash = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self._hash.update(data)
        self.size += len(data)
        return len(data)

    def digest(self) -> str:
        return self._hash.hexdigest()


class PeakMemory:
    """The peak resident memory over the block, sampled every 20 ms from a thread;
    ``growth`` is that peak less the resident memory at its start."""

    def __init__(self) -> None:
        self.start = self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="peak-memory", daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.02):
            self.peak = max(self.peak, rss())

    @property
    def growth(self) -> int:
        return self.peak - self.start

    def __enter__(self) -> PeakMemory:
        self.start = self.peak = rss()
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, rss())
