"""Bounded capture of a stage's output pipes."""

from __future__ import annotations

import os

from node.fncall.nsjail.zygote.common import CHUNK


class Capture:
    """Bounded capture of one pipe: keeps ``cap`` bytes, drains and drops the rest."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd = fd
        self.cap = cap
        self.data = bytearray()
        self.truncated = False
        self.open = True
        os.set_blocking(fd, False)

    def read(self) -> None:
        for _ in range(16):
            try:
                chunk = os.read(self.fd, CHUNK)
            except BlockingIOError:
                return
            if not chunk:
                self.open = False
                return
            room = self.cap - len(self.data)
            if room > 0:
                self.data += chunk[:room]
            if len(chunk) > room:
                self.truncated = True

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")
