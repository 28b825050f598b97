"""The framing between the node and its wasm worker process: JSON messages with an
optional binary attachment, never pickle.

One frame is ``u32 json length | u32 blob length | JSON (UTF-8) | blob``, big-endian.
The JSON is one object with an ``op``; the blob carries bytes that would be wasteful as
base64 (a compiled ``.cwasm``). Both lengths are checked against the reader's bounds
*before* anything is read or allocated, so a peer cannot make the other side buffer more
than it agreed to: a frame over a bound raises ``FrameError`` and the channel is dropped.

Messages, node -> worker (each with an ``id`` the reply repeats):

* ``interpreter`` {language, sha256} + blob: load a compiled interpreter
* ``start`` {}: warm the pools; replies once they are warm
* ``load`` {sha256, name} + blob: load a compiled raw module; replies ``{}`` or ``{error}``
* ``run`` {spec, inv, module}: one call; replies ``{result}`` (a ``RunResult``) or
  ``{need: sha256}`` when the raw module is not loaded
* ``close`` {}: close everything and exit

worker -> node: ``reply`` {id, ...} and, unasked, ``status`` {warm, starting, inventory,
idle} whenever the pools change.
"""

from __future__ import annotations

import asyncio
import json
import struct
from dataclasses import dataclass
from typing import Any

HEADER = struct.Struct(">II")


class FrameError(ValueError):
    """A frame broke the protocol (over a bound, not JSON, not an object)."""


@dataclass(frozen=True)
class Bounds:
    max_json: int
    max_blob: int


@dataclass
class Frame:
    msg: dict[str, Any]
    blob: bytes = b""


class FrameWriter:
    """Writes frames to a stream, those of one turn of the event loop together.

    A frame waits in a list until the end of the loop's turn (``call_soon``), and every
    frame written meanwhile joins it: they leave in one write, one system call, and wake
    the reader once. Frames keep their order as long as every frame of the stream goes
    through this writer. The caller's ``drain`` of the stream still applies the
    transport's back-pressure (to what was flushed before).
    """

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._queued: list[bytes] = []

    def write(self, frame: bytes) -> None:
        if not self._queued:
            asyncio.get_running_loop().call_soon(self.flush)
        self._queued.append(frame)

    def flush(self) -> None:
        """Write what is queued now (idempotent)."""
        queued, self._queued = self._queued, []
        if not queued or self._writer.is_closing():
            return
        self._writer.write(queued[0] if len(queued) == 1 else b"".join(queued))


def encode(msg: dict[str, Any], blob: bytes = b"") -> bytes:
    body = json.dumps(msg, separators=(",", ":")).encode("utf-8")
    return HEADER.pack(len(body), len(blob)) + body + blob


async def read_frame(reader: asyncio.StreamReader, bounds: Bounds) -> Frame | None:
    """The next frame, or None at a clean end of stream (EOF between frames)."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError("the stream ended inside a frame header") from None
    json_len, blob_len = HEADER.unpack(header)
    if json_len > bounds.max_json or blob_len > bounds.max_blob:
        raise FrameError(
            f"frame of {json_len} + {blob_len} bytes is over the bounds "
            f"({bounds.max_json} + {bounds.max_blob})"
        )
    try:
        body = await reader.readexactly(json_len)
        blob = await reader.readexactly(blob_len) if blob_len else b""
    except asyncio.IncompleteReadError:
        raise FrameError("the stream ended inside a frame") from None
    try:
        msg = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FrameError(f"a frame is not JSON: {exc}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        raise FrameError("a frame is not a JSON object with an op")
    return Frame(msg, blob)
