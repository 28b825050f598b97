"""The node-worker framing: bounds checked before reading, frames of one loop turn
written together and in order."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from node.fncall.wasm.protocol import Bounds, FrameError, FrameWriter, encode, read_frame

pytestmark = pytest.mark.asyncio


class Recorder:
    """A stream writer that keeps each ``write`` it is given."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closing


def _writer(recorder: Recorder) -> FrameWriter:
    return FrameWriter(cast(Any, recorder))


async def _frames(data: bytes) -> list[dict[str, Any]]:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    out = []
    while (
        frame := await read_frame(reader, Bounds(max_json=1 << 20, max_blob=1 << 20))
    ) is not None:
        out.append(frame.msg)
    return out


async def test_the_frames_of_one_turn_leave_in_one_write_in_order() -> None:
    recorder = Recorder()
    frames = _writer(recorder)
    for n in range(5):
        frames.write(encode({"op": "run", "n": n}))
    assert recorder.writes == []  # not before the end of the turn
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(recorder.writes) == 1
    assert [m["n"] for m in await _frames(recorder.writes[0])] == [0, 1, 2, 3, 4]
    frames.write(encode({"op": "run", "n": 5}))  # a later turn: a write of its own
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(recorder.writes) == 2
    assert [m["n"] for m in await _frames(recorder.writes[1])] == [5]


async def test_flush_writes_at_once_and_the_scheduled_flush_then_does_nothing() -> None:
    recorder = Recorder()
    frames = _writer(recorder)
    frames.write(encode({"op": "a"}))
    frames.flush()
    assert len(recorder.writes) == 1
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(recorder.writes) == 1


async def test_nothing_is_written_to_a_closing_stream() -> None:
    recorder = Recorder()
    frames = _writer(recorder)
    frames.write(encode({"op": "a"}))
    recorder.closing = True
    frames.flush()
    assert recorder.writes == []


async def test_a_frame_over_its_bounds_is_refused_before_it_is_read() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(encode({"op": "x", "pad": "y" * 100}))
    with pytest.raises(FrameError, match="over the bounds"):
        await read_frame(reader, Bounds(max_json=50, max_blob=0))
