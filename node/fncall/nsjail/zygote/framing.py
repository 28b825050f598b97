"""The control channel: PID 1's framed JSON messages with the host (a 4-byte big-endian
length, then that many bytes of UTF-8 JSON), over private descriptors."""

from __future__ import annotations

import json
import os
import struct
from typing import Any

HEADER = struct.Struct(">I")
MAX_REQUEST = 256 * 1024 * 1024


class Channel:
    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd = rfd
        self.wfd = wfd

    def _read_exact(self, n: int) -> bytes | None:
        parts: list[bytes] = []
        while n:
            chunk = os.read(self.rfd, min(n, 1 << 20))
            if not chunk:
                if parts:
                    raise EOFError("control channel closed mid-message")
                return None
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def recv(self) -> dict[str, Any] | None:
        header = self._read_exact(HEADER.size)
        if header is None:
            return None
        (size,) = HEADER.unpack(header)
        if size > MAX_REQUEST:
            raise ValueError(f"request of {size} bytes is too large")
        body = self._read_exact(size)
        if body is None:
            raise EOFError("control channel closed mid-message")
        message = json.loads(body)
        if not isinstance(message, dict):
            raise ValueError("request is not a JSON object")
        return message

    def send(self, message: dict[str, Any]) -> None:
        body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
        view = memoryview(HEADER.pack(len(body)) + body)
        while view:
            written = os.write(self.wfd, view)
            view = view[written:]
