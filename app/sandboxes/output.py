"""A command's output as ``/v1/sandboxes/{id}/exec`` answers it: text, and its exact bytes
where text would not carry them.

The node passes the bytes its pipes gave (``wire.sandboxes.ExecOutput``); they are decoded
here, once per stream, never chunk by chunk (a character split between two reads would
become two U+FFFD). The rule is the same for the whole answer and for a stream
(docs/sandboxes.md, "Output"):

* ``stdout`` / ``stderr`` (a stream's ``data``): the text, UTF-8 decoded, an invalid byte
  shown as U+FFFD;
* ``stdout_b64`` / ``stderr_b64`` (a stream's ``data_b64``): the exact bytes, base64,
  given when they are not valid UTF-8 or when the request asks ``"binary": true``; else
  null, and the text's UTF-8 is the exact bytes.

A stream's lines end with ``\n`` only: the line separators JSON leaves raw in a string
(U+0085, U+2028, U+2029, which ``str.splitlines`` and httpx's ``iter_lines`` also split
at) are escaped (``ndjson_line``).

In a stream each output event's text covers whole characters: the bytes of a character
cut at the end of a read are held back and sent with the next event (or, if the command
ends in the middle of one, as U+FFFD in one last output event before ``exit``). So the
events' bytes (``data_b64``, else ``data`` as UTF-8), joined, are the output exactly.
"""

from __future__ import annotations

import base64
import codecs
from collections.abc import AsyncIterator
from typing import Literal

from pydantic import BaseModel

from app.schemas.sandboxes import ExecOut, ExecOutputEvent
from wire.sandboxes import ExecEvent, ExecExit, ExecOutput, ExecResult

Stream = Literal["stdout", "stderr"]


#: characters JSON may leave raw in a string that line splitters take for line ends
_SEPARATORS = (
    ("\u0085".encode(), b"\\u0085"),
    ("\u2028".encode(), b"\\u2028"),
    ("\u2029".encode(), b"\\u2029"),
)


def ndjson_line(event: BaseModel) -> bytes:
    """One event as a line of NDJSON that every line splitter reads as one line (in JSON
    these characters can only be inside strings, where the escape means the same)."""
    line = event.model_dump_json().encode()
    for raw, escaped in _SEPARATORS:
        if raw in line:
            line = line.replace(raw, escaped)
    return line + b"\n"


def _text(data: bytes) -> tuple[str, bool]:
    """``data`` as text, and whether it was valid UTF-8 (else U+FFFD stands for what was
    not)."""
    try:
        return data.decode(), True
    except UnicodeDecodeError:
        return data.decode(errors="replace"), False


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def exec_out(result: ExecResult, *, binary: bool) -> ExecOut:
    """The whole answer: each stream decoded once, its bytes too when needed."""
    stdout, stdout_valid = _text(result.stdout)
    stderr, stderr_valid = _text(result.stderr)
    fields = result.model_dump(exclude={"stdout", "stderr"})
    return ExecOut(
        **fields,
        stdout=stdout,
        stderr=stderr,
        stdout_b64=None if stdout_valid and not binary else _b64(result.stdout),
        stderr_b64=None if stderr_valid and not binary else _b64(result.stderr),
    )


class TextDecoder:
    """One stream's chunks as text that covers whole characters, with the bytes each
    piece of text stands for."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._held = b""

    def feed(self, data: bytes, *, final: bool = False) -> tuple[str, bytes]:
        """The text of ``data`` and of what was held before it, less the bytes of a
        character it cuts (held for the next call; with ``final``, shown as U+FFFD); and
        the bytes that text stands for."""
        text = self._decoder.decode(data, final)
        pending = self._decoder.getstate()[0]
        whole = self._held + data
        self._held = pending
        return text, whole[: len(whole) - len(pending)]


def _event(stream: Stream, text: str, data: bytes, binary: bool) -> ExecOutputEvent:
    exact = binary or text.encode() != data
    return ExecOutputEvent(stream=stream, data=text, data_b64=_b64(data) if exact else None)


async def stream_events(
    events: AsyncIterator[ExecEvent], *, binary: bool
) -> AsyncIterator[ExecOutputEvent | ExecEvent]:
    """The node's events for a streamed answer: output as text of whole characters (and
    its bytes when needed); what a stream holds back at its end comes before ``exit``."""
    decoders: dict[Stream, TextDecoder] = {"stdout": TextDecoder(), "stderr": TextDecoder()}
    async for event in events:
        if isinstance(event, ExecOutput):
            stream: Stream = "stderr" if event.stream == "stderr" else "stdout"  # pty: stdout
            text, data = decoders[stream].feed(event.data)
            if data:
                yield _event(stream, text, data, binary)
            continue
        if isinstance(event, ExecExit):
            for name, decoder in decoders.items():
                text, data = decoder.feed(b"", final=True)
                if data:
                    yield _event(name, text, data, binary)
        yield event
