"""What the sync and async clients share: settings, request bodies and the exec stream.

No I/O here; ``_client`` and ``_sandbox`` send what these functions build (a file
object given to ``files.write`` is read only as its request sends it).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, cast
from urllib.parse import quote

import httpx

from corral._errors import UnexpectedResponse
from corral._models import ExecResult, exact_bytes

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT = 60.0
#: how much longer than a command's own timeout its exec request may take
EXEC_MARGIN_S = 30.0


def resolve_url(url: str | None) -> str:
    """``url``, else ``CORRAL_URL``, else the local default (read when a client is made)."""
    return (url or os.environ.get("CORRAL_URL") or DEFAULT_URL).rstrip("/")


def resolve_key(api_key: str | None) -> str | None:
    return api_key or os.environ.get("CORRAL_API_KEY") or None


def headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def one(sandbox_id: str, tail: str = "") -> str:
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}{tail}"


def drop_none(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def create_body(
    *,
    image: str | None,
    backend: str | None,
    cpu: float | None,
    memory_mb: int | None,
    disk_mb: int | None,
    ttl_s: float | None,
    idle_timeout_s: float | None,
    env: Mapping[str, str] | None,
    metadata: Mapping[str, str] | None,
    user: str | None,
    network: Sequence[str] | None = None,
) -> dict[str, Any]:
    """A create body with only what was given (the server fills in the rest). ``network``
    is the allow-list (``HOST[:PORT]`` entries; ``0.0.0.0/0`` is the internet); none or
    an empty one: no network."""
    return drop_none(
        image=image,
        backend=backend,
        cpu=cpu,
        memory_mb=memory_mb,
        disk_mb=disk_mb,
        ttl_s=ttl_s,
        idle_timeout_s=idle_timeout_s,
        env=dict(env) if env is not None else None,
        metadata=dict(metadata) if metadata is not None else None,
        user=user,
        network={"allow": list(network)} if network is not None else None,
    )


def exec_body(
    cmd: list[str] | str,
    *,
    env: Mapping[str, str] | None,
    cwd: str | None,
    user: str | None,
    stdin: str | None,
    timeout_s: float | None,
    stream: bool,
) -> dict[str, Any]:
    """An argv runs as given; a string runs through ``/bin/sh -c``."""
    if isinstance(cmd, str):
        command: dict[str, Any] = {"command": cmd}
    elif cmd and all(isinstance(arg, str) for arg in cmd):
        command = {"cmd": list(cmd)}
    else:
        raise ValueError("cmd is a non-empty list of strings or a shell line")
    return {
        **command,
        **drop_none(env=dict(env) if env else None, cwd=cwd, user=user, stdin=stdin),
        "timeout_s": timeout_s,
        "stream": stream,
    }


def exec_read_timeout(timeout_s: float | None, default: float) -> float | None:
    """How long to wait for an exec answer (or the next event of its stream)."""
    return None if timeout_s is None else max(default, timeout_s + EXEC_MARGIN_S)


def file_mode(mode: int | None) -> str | None:
    """Permission bits as the API takes them (octal digits)."""
    if mode is None:
        return None
    if not 0 <= mode <= 0o7777:
        raise ValueError(f"mode {mode:#o} is not permission bits (0 to 0o7777)")
    return f"{mode:03o}"


def as_bytes(data: bytes | bytearray | memoryview | str) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


#: what ``files.write`` sends: bytes or text whole; a binary file object or an iterable of
#: byte chunks streamed as read (never held whole, whatever its size)
FileData = bytes | bytearray | memoryview | str | BinaryIO | Iterable[bytes]
#: the chunk a file object is read in, as it is sent
UPLOAD_CHUNK = 1 << 20


def file_content(data: FileData) -> bytes | Iterator[bytes]:
    """A write's body: bytes as they are, a file object or iterable as a stream of chunks."""
    if isinstance(data, (bytes, bytearray, memoryview, str)):
        return as_bytes(data)
    if hasattr(data, "read"):
        return _read_chunks(cast(BinaryIO, data))
    return (bytes(chunk) for chunk in data)


def _read_chunks(file: BinaryIO) -> Iterator[bytes]:
    while chunk := file.read(UPLOAD_CHUNK):
        yield chunk


async def async_file_content(
    data: FileData | AsyncIterable[bytes],
) -> bytes | AsyncIterator[bytes]:
    """``file_content`` for an async client: a file object is read off the event loop."""
    if isinstance(data, (bytes, bytearray, memoryview, str)):
        return as_bytes(data)
    if hasattr(data, "read"):
        return _read_chunks_async(cast(BinaryIO, data))
    if isinstance(data, AsyncIterable):
        return _async_chunks(data)
    return _async_chunks(_iterate(data))


async def _read_chunks_async(file: BinaryIO) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(file.read, UPLOAD_CHUNK):
        yield chunk


async def _iterate(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def _async_chunks(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield bytes(chunk)


def json_object(response: httpx.Response) -> dict[str, Any]:
    """A success answer's JSON object."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise UnexpectedResponse(
            f"not a Corral answer: {response.text[:200]!r}", status=response.status_code
        )
    return body


@dataclass
class ExecStream:
    """Gathers an exec's NDJSON events (``started``, ``output``..., ``exit``) into its
    ``ExecResult``; ``feed`` hands back each output chunk as ``(stream, data)``."""

    pid: int | None = None
    exit: dict[str, Any] | None = None
    chunks: dict[str, list[str]] = field(default_factory=lambda: {"stdout": [], "stderr": []})
    #: the exact bytes of each output event (its ``data_b64``, else its text's UTF-8)
    raw: dict[str, list[bytes]] = field(default_factory=lambda: {"stdout": [], "stderr": []})

    def feed(self, line: str) -> tuple[str, str] | None:
        if not line.strip():
            return None
        try:
            event = json.loads(line)
            kind = event["kind"]
        except (ValueError, KeyError, TypeError):
            raise UnexpectedResponse(f"not an exec event: {line[:200]!r}") from None
        if kind == "started":
            self.pid = event.get("pid")
        elif kind == "output" and event.get("stream") in self.chunks:
            self.chunks[event["stream"]].append(event["data"])
            self.raw[event["stream"]].append(exact_bytes(event.get("data_b64"), event["data"]))
            return event["stream"], event["data"]
        elif kind == "exit":
            self.exit = event
        return None  # other kinds: from a newer server

    def result(self) -> ExecResult:
        stdout, stderr = "".join(self.chunks["stdout"]), "".join(self.chunks["stderr"])
        end = self.exit or {"exit_code": None, "error": "the command's end was not seen"}
        return ExecResult.from_json(
            {**end, "pid": self.pid},
            stdout=stdout,
            stderr=stderr,
            stdout_bytes=b"".join(self.raw["stdout"]),
            stderr_bytes=b"".join(self.raw["stderr"]),
        )
