"""A command's output as the exec API answers it: text decoded across the node's chunks,
and the exact bytes wherever the text does not carry them."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import AsyncIterator

from app.sandboxes.output import exec_out, ndjson_line, stream_events
from app.schemas.sandboxes import ExecOutputEvent
from wire.sandboxes import ExecEvent, ExecExit, ExecOutput, ExecResult, ExecStarted

EURO = "€".encode()


async def node_events(chunks: list[tuple[str, bytes]]) -> AsyncIterator[ExecEvent]:
    yield ExecStarted(pid=1)
    for stream, data in chunks:
        yield ExecOutput(stream=stream, data=data)  # type: ignore[arg-type]
    yield ExecExit(exit_code=0, duration_ms=1.0)


async def answered(chunks: list[tuple[str, bytes]], binary: bool = False) -> list[ExecEvent]:
    return [e async for e in stream_events(node_events(chunks), binary=binary)]  # type: ignore[misc]


def outputs(events: list[object], stream: str = "stdout") -> list[ExecOutputEvent]:
    return [e for e in events if isinstance(e, ExecOutputEvent) and e.stream == stream]


def exact(events: list[ExecOutputEvent]) -> bytes:
    """What a client joins: each event's bytes, else its text's UTF-8."""
    return b"".join(
        base64.b64decode(e.data_b64) if e.data_b64 is not None else e.data.encode() for e in events
    )


async def test_a_character_cut_between_two_chunks_is_whole_in_the_later_event() -> None:
    events = await answered([("stdout", b"ab" + EURO[:1]), ("stdout", EURO[1:] + b"c")])
    out = outputs(events)
    assert [e.data for e in out] == ["ab", "€c"] and all(e.data_b64 is None for e in out)
    assert isinstance(events[0], ExecStarted) and isinstance(events[-1], ExecExit)


async def test_streams_are_decoded_apart_and_a_cut_at_the_end_comes_before_exit() -> None:
    events = await answered(
        [("stdout", EURO[:2]), ("stderr", b"x"), ("stdout", EURO[2:] + EURO[:1])]
    )
    assert [e.data for e in outputs(events)] == ["€", "\ufffd"]
    assert [e.data for e in outputs(events, "stderr")] == ["x"]
    last = outputs(events)[-1]
    assert last.data_b64 == base64.b64encode(EURO[:1]).decode()  # the cut byte, exactly
    assert isinstance(events[-1], ExecExit) and events[-2] is last


async def test_bytes_that_are_not_text_come_exactly_and_binary_asks_for_them_always() -> None:
    noise = os.urandom(5000)
    chunks = [("stdout", noise[:1234]), ("stdout", noise[1234:])]
    out = outputs(await answered(chunks))
    assert exact(out) == noise and any(e.data_b64 is not None for e in out)
    asked = outputs(await answered([("stdout", b"plain")], binary=True))
    assert asked[0].data == "plain" and asked[0].data_b64 == base64.b64encode(b"plain").decode()


def test_the_whole_answer_gives_bytes_only_where_text_would_not_carry_them() -> None:
    noise = b"\xff\xfe" + os.urandom(100)
    result = ExecResult(exit_code=0, duration_ms=1.0, stdout=b"caf\xc3\xa9", stderr=noise)
    out = exec_out(result, binary=False)
    assert out.stdout == "café" and out.stdout_b64 is None
    assert out.stderr == noise.decode(errors="replace")
    assert out.stderr_b64 is not None and base64.b64decode(out.stderr_b64) == noise
    asked = exec_out(result, binary=True)
    assert asked.stdout_b64 is not None and base64.b64decode(asked.stdout_b64) == b"caf\xc3\xa9"


async def test_a_stream_line_ends_only_at_its_newline() -> None:
    """U+2028 is valid text, left raw by JSON; httpx's ``iter_lines`` (the SDK's reader)
    splits at it as ``str.splitlines`` does."""
    text = "a\u2028b\u2029c\u0085d"
    events = await answered([("stdout", text.encode())])
    lines = b"".join(ndjson_line(e) for e in events).decode()
    assert len(lines.splitlines()) == len(events) == 3
    assert json.loads(lines.splitlines()[1])["data"] == text
