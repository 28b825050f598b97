"""The agent protocol's frame codec: round trips, bounds, malformed input."""

from __future__ import annotations

import asyncio

import pytest

from node.sandboxes.microvm.frames import (
    GUEST_CTL,
    GUEST_DATA,
    HEADER,
    HEADER_SIZE,
    HOST_CTL,
    HOST_DATA,
    MAX_PAYLOAD,
    Frame,
    FrameError,
    FrameType,
    decode,
    decode_fields,
    decode_header,
    encode,
    encode_fields,
    field_map,
    read_frame,
)


def test_round_trip() -> None:
    raw = encode(7, FrameType.STDOUT, b"hello") + b"rest"
    frame, rest = decode(raw)
    assert frame == Frame(7, FrameType.STDOUT, b"hello")
    assert rest == b"rest"
    assert raw[:HEADER_SIZE] == HEADER.pack(5, 7, 20, 0)


def test_largest_payload_passes_and_one_more_byte_fails() -> None:
    frame, _ = decode(encode(1, FrameType.FILE_DATA, b"x" * MAX_PAYLOAD))
    assert len(frame.payload) == MAX_PAYLOAD
    with pytest.raises(FrameError):
        encode(1, FrameType.FILE_DATA, b"x" * (MAX_PAYLOAD + 1))
    with pytest.raises(FrameError):
        decode_header(HEADER.pack(MAX_PAYLOAD + 1, 1, 20, 0))
    with pytest.raises(FrameError):
        decode_header(HEADER.pack(0xFFFFFFFF, 1, 20, 0))


def test_truncated_frames_and_headers() -> None:
    with pytest.raises(FrameError):
        decode(encode(1, FrameType.STDOUT, b"abc")[:-1])
    with pytest.raises(FrameError):
        decode(b"\x01\x00")
    with pytest.raises(FrameError):
        encode(-1, FrameType.PING)
    with pytest.raises(FrameError):
        encode(1 << 32, FrameType.PING)


def test_fields_round_trip_with_repeats_and_equals_signs() -> None:
    fields = [("arg", "sh"), ("arg", "-c"), ("env", "A=b=c"), ("cwd", "/")]
    payload = encode_fields(fields)
    assert payload.endswith(b"\0")
    assert decode_fields(payload) == fields
    assert field_map(payload)["env"] == "A=b=c"
    assert decode_fields(b"") == []
    assert decode_fields(b"k=\0") == [("k", "")]


@pytest.mark.parametrize(
    "payload",
    [b"key=value", b"novalue\0", b"=v\0", b"a=1\0\0", b"k=\xff\0"],
    ids=["no-final-nul", "no-equals", "empty-key", "empty-field", "not-utf8"],
)
def test_malformed_fields(payload: bytes) -> None:
    with pytest.raises(FrameError):
        decode_fields(payload)


@pytest.mark.parametrize("fields", [[("a=b", "1")], [("", "1")], [("k", "a\0b")], [("k\0", "1")]])
def test_fields_that_cannot_be_encoded(fields: list[tuple[str, str]]) -> None:
    with pytest.raises(FrameError):
        encode_fields(fields)


def test_fields_beyond_a_frame_cannot_be_encoded() -> None:
    with pytest.raises(FrameError):
        encode_fields([("arg", "x" * MAX_PAYLOAD)])


def test_port_type_sets_are_disjoint_by_direction() -> None:
    assert not HOST_CTL & HOST_DATA
    assert not GUEST_CTL & GUEST_DATA
    assert FrameType.CREDIT in HOST_CTL and FrameType.CREDIT in GUEST_CTL
    assert FrameType.FILE_DATA in HOST_DATA and FrameType.FILE_DATA in GUEST_DATA


async def test_read_frame_from_a_stream() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(encode(3, FrameType.PONG) + encode(4, FrameType.STDERR, b"e"))
    reader.feed_eof()
    assert await read_frame(reader) == Frame(3, FrameType.PONG, b"")
    assert await read_frame(reader) == Frame(4, FrameType.STDERR, b"e")
    assert await read_frame(reader) is None


@pytest.mark.parametrize(
    "raw",
    [
        encode(1, FrameType.STDOUT, b"abcd")[:-2],
        encode(1, FrameType.STDOUT)[:5],
        HEADER.pack(MAX_PAYLOAD + 1, 1, 20, 0) + b"x" * 100,
    ],
    ids=["inside-payload", "inside-header", "too-large"],
)
async def test_read_frame_malformed(raw: bytes) -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(raw)
    reader.feed_eof()
    with pytest.raises(FrameError):
        await read_frame(reader)
