"""Bounded capture of a guest's stdout or stderr (a WASI custom output callback).

wasmtime calls the callback from one of its own threads with each write. The capture keeps
at most ``limit`` bytes and counts the rest, always reporting the write as done, so a flood
costs the guest time (bounded by its deadline) and the host nothing. Before ``arm()`` the
capture is in warm-up mode: it only looks for the ready marker a bootstrap writes when it
is about to wait for its program, and keeps nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class OutputCapture:
    def __init__(
        self, *, marker: bytes | None = None, on_marker: Callable[[], None] | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._chunks: list[bytes] = []
        self._kept = 0
        self._limit = 0
        self.total = 0  #: bytes written during the call, kept or not
        self._armed = marker is None
        self._marker = marker
        self._on_marker = on_marker
        self._pending = b""  #: warm-up output, searched for the marker

    def arm(self, limit: int) -> None:
        """Start keeping output, up to ``limit`` bytes."""
        with self._lock:
            self._limit = limit
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
                self.total += len(data)
                room = self._limit - self._kept
                if room > 0:
                    piece = data[:room]
                    self._chunks.append(piece)
                    self._kept += len(piece)
        if fire and self._on_marker is not None:
            self._on_marker()
        return len(data)

    @property
    def truncated(self) -> bool:
        return self.total > self._kept

    def text(self) -> str:
        with self._lock:
            return b"".join(self._chunks).decode("utf-8", errors="replace")
