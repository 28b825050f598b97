"""The frame codec of the microVM agent's protocol (docs/microvm-protocol.md).

A frame: a 12-byte header (u32 LE payload length, u32 LE stream id, u16 LE type, u16 LE
flags) then the payload. Control payloads are fields: NUL-terminated ``key=value``
strings; data payloads are raw bytes. Everything here is pure: the channel and the tests
use it on bytes that may come from a hostile guest, so every decoder checks its input and
raises ``FrameError``.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

HEADER = struct.Struct("<IIHH")
HEADER_SIZE = HEADER.size
#: the largest payload either side sends or accepts
MAX_PAYLOAD = 65536
#: each stream's initial window, in each direction
WINDOW = 262144
#: the most live streams the agent keeps
MAX_STREAMS = 1024
#: the largest stream id (u32)
MAX_STREAM_ID = 0xFFFFFFFF


class FrameType(IntEnum):
    HELLO = 1
    HELLO_OK = 2
    PING = 3
    PONG = 4
    EXEC = 10
    STARTED = 11
    EXIT = 12
    SIGNAL = 13
    STDIN = 14
    STDIN_CLOSE = 15
    RESIZE = 16
    RELEASE = 17
    ERROR = 19
    STDOUT = 20
    STDERR = 21
    CREDIT = 30
    FILE_READ = 40
    FILE_INFO = 41
    FILE_DATA = 42
    FILE_END = 43
    FILE_WRITE = 44
    ENTRY = 45
    STAT = 46
    LIST = 47
    LIST_END = 48
    MKDIR = 49
    REMOVE = 50
    MOVE = 51


T = FrameType
#: what the host may send on each port
HOST_CTL = frozenset(
    {T.HELLO, T.PING, T.EXEC, T.SIGNAL, T.RESIZE, T.RELEASE, T.CREDIT, T.FILE_READ}
    | {T.FILE_WRITE, T.STAT, T.LIST, T.MKDIR, T.REMOVE, T.MOVE}
)
HOST_DATA = frozenset({T.STDIN, T.STDIN_CLOSE, T.FILE_DATA, T.FILE_END})
#: what the guest may send on each port
GUEST_CTL = frozenset(
    {T.HELLO_OK, T.PONG, T.STARTED, T.ERROR, T.CREDIT, T.FILE_INFO, T.ENTRY, T.LIST_END}
)
GUEST_DATA = frozenset({T.EXIT, T.STDOUT, T.STDERR, T.FILE_DATA, T.FILE_END})
#: frames whose payload is fields (the others: raw bytes)
RAW = frozenset({T.STDIN, T.STDOUT, T.STDERR, T.FILE_DATA})


class FrameError(ValueError):
    """Bytes that are not a well-formed frame or field list (or values that cannot be
    encoded as one)."""


@dataclass(frozen=True, slots=True)
class Frame:
    stream: int
    type: int
    payload: bytes = b""


def encode(stream: int, type_: int, payload: bytes = b"") -> bytes:
    if not 0 <= stream <= MAX_STREAM_ID:
        raise FrameError(f"stream id {stream} out of range")
    if len(payload) > MAX_PAYLOAD:
        raise FrameError(f"payload of {len(payload)} bytes > {MAX_PAYLOAD}")
    return HEADER.pack(len(payload), stream, type_, 0) + payload


def decode_header(header: bytes) -> tuple[int, int, int]:
    """(payload length, stream id, type) of a 12-byte header; flags are ignored."""
    if len(header) != HEADER_SIZE:
        raise FrameError(f"a header is {HEADER_SIZE} bytes, not {len(header)}")
    length, stream, type_, _flags = HEADER.unpack(header)
    if length > MAX_PAYLOAD:
        raise FrameError(f"payload of {length} bytes > {MAX_PAYLOAD}")
    return length, stream, type_


def decode(data: bytes) -> tuple[Frame, bytes]:
    """The first whole frame of ``data`` and the bytes after it (``FrameError`` when
    ``data`` does not hold a whole frame)."""
    length, stream, type_ = decode_header(data[:HEADER_SIZE])
    end = HEADER_SIZE + length
    if len(data) < end:
        raise FrameError("a truncated frame")
    return Frame(stream, type_, bytes(data[HEADER_SIZE:end])), bytes(data[end:])


Field = tuple[str, str]


def encode_fields(fields: Iterable[Field] | Mapping[str, str]) -> bytes:
    items = fields.items() if isinstance(fields, Mapping) else fields
    out = bytearray()
    for key, value in items:
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise FrameError(f"field {key!r} cannot be encoded")
        out += f"{key}={value}".encode() + b"\0"
    if len(out) > MAX_PAYLOAD:
        raise FrameError(f"fields of {len(out)} bytes > {MAX_PAYLOAD}")
    return bytes(out)


def decode_fields(payload: bytes) -> list[Field]:
    """The fields of a control payload, in order (keys may repeat)."""
    if not payload:
        return []
    if len(payload) > MAX_PAYLOAD:
        raise FrameError("fields too long")
    if not payload.endswith(b"\0"):
        raise FrameError("a field list without its final NUL")
    fields: list[Field] = []
    for raw in payload[:-1].split(b"\0"):
        key, eq, value = raw.partition(b"=")
        if not eq or not key:
            raise FrameError(f"a field without a key: {raw[:40]!r}")
        try:
            fields.append((key.decode(), value.decode()))
        except UnicodeDecodeError as e:
            raise FrameError("a field that is not UTF-8") from e
    return fields


def field_map(payload: bytes) -> dict[str, str]:
    """The fields as a dict (a repeated key: its last value)."""
    return dict(decode_fields(payload))


async def read_frame(reader: asyncio.StreamReader) -> Frame | None:
    """The next frame, or None at a clean end of stream (between frames)."""
    try:
        header = await reader.readexactly(HEADER_SIZE)
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise FrameError("the stream ended inside a header") from e
        return None
    length, stream, type_ = decode_header(header)
    try:
        payload = await reader.readexactly(length) if length else b""
    except asyncio.IncompleteReadError as e:
        raise FrameError("the stream ended inside a payload") from e
    return Frame(stream, type_, payload)
