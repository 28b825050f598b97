"""The gateway's half of a sandbox's file transfers: streamed both ways, never held whole.

A download is the node's answer passed on chunk by chunk (``FileAnswer``); an upload is
the caller's body passed on as it arrives (``bounded``), multipart ones too: each file of
a ``multipart/form-data`` body is streamed to the node while the body is parsed
(``MultipartFiles``, python-multipart's push parser fed chunk by chunk), never spooled to
memory or disk. Uploads are exempt from the gateway's body cap (``app.http.middleware``):
each file is bounded by ``max_file_bytes`` (413 ``payload_too_large``) and by the
sandbox's disk (507 ``disk_full``, from the node), and a client that sends nothing for
``transfer_idle_seconds`` is refused (408 ``upload_stalled``), and a download whose client
takes nothing for as long is cut: either frees the node's transfer slot. A listing the
caller does not page (E2B's ListDir) is gathered page by page up to a cap, and refused
past it (``list_capped``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from app.errors import BadRequest, PayloadTooLarge, UploadStalled
from app.sandboxes.nodes import NodeClient, NodeFile
from wire.sandboxes import MAX_FILE_BYTES, FileEntry

log = logging.getLogger(__name__)

#: files in one multipart upload, at most
MAX_PARTS = 1000
#: the headers of one multipart part, at most
MAX_PART_HEADERS = 16 << 10
#: the bytes of a multipart body's parts that are not read (form fields), at most: what a
#: file's bound does not cover (a field that never ends, sent as fast as it is parsed)
MAX_PASSED_OVER = 1 << 20


class FileAnswer(StreamingResponse):
    """A file's bytes as the node streams them; the node's answer is released when this
    one ends, however it ends (sent, cut, never started, or a client that takes nothing
    for ``idle_s``: the connection is then closed, the answer unfinished)."""

    def __init__(self, file: NodeFile, *, idle_s: float | None = None) -> None:
        super().__init__(file.chunks(), media_type="application/octet-stream")
        self._file = file
        self._idle_s = idle_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stalled = False

        async def paced(message: Message) -> None:
            nonlocal stalled
            try:
                async with asyncio.timeout(self._idle_s):
                    await send(message)
            except TimeoutError:
                stalled = True
                raise

        try:
            await super().__call__(scope, receive, paced)
        except BaseException:
            if not stalled:
                raise
            log.info("a download's client took nothing for %s s: cut", self._idle_s)
        finally:
            await self._file.aclose()


def transfer_idle(request: Request) -> float:
    """How long a transfer may wait on its client (``transfer_idle_seconds``)."""
    idle_s: float = request.app.state.services.settings.transfer_idle_seconds
    return idle_s


def file_limit(request: Request) -> int:
    """The largest file a transfer carries (the ``max_file_bytes`` setting)."""
    limit: int = request.app.state.services.settings.max_file_bytes
    return min(limit, MAX_FILE_BYTES)


async def upload_body(request: Request) -> AsyncIterator[bytes]:
    """The request's body as it arrives; ``UploadStalled`` when the client sends nothing
    for ``transfer_idle_seconds`` (a slow client is fine, a silent one is not)."""
    idle_s = transfer_idle(request)
    body = aiter(request.stream())
    while True:
        try:
            async with asyncio.timeout(idle_s):
                chunk = await anext(body, None)
        except TimeoutError:
            raise UploadStalled(f"the upload sent nothing for {idle_s:g} s") from None
        if chunk is None:
            return
        yield chunk


async def bounded(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """``chunks``, refused (``PayloadTooLarge``) once they pass ``limit`` bytes."""
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"a file is at most {limit} bytes")
        if chunk:
            yield chunk


def refuse_declared_over(request: Request, limit: int) -> None:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"a file is at most {limit} bytes")


@dataclass
class Part:
    """One part of a multipart body: its field name and file name (None: not a file)."""

    name: str
    filename: str | None


class MultipartFiles:
    """A ``multipart/form-data`` body read as it arrives: ``parts()`` yields each part,
    ``data()`` that part's bytes (to be read before the next part is asked for; what is
    not read is passed over). ``chunks``: the body (default: the request's stream)."""

    def __init__(self, request: Request, chunks: AsyncIterator[bytes] | None = None) -> None:
        kind, options = parse_options_header(request.headers.get("content-type", ""))
        boundary = options.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            raise BadRequest("a multipart/form-data body needs its boundary")
        self._body = chunks if chunks is not None else aiter(request.stream())
        self._events: deque[tuple[str, bytes]] = deque()
        self._header = [b"", b""]
        self._headers: dict[bytes, bytes] = {}
        self._header_bytes = 0
        self._ended = False
        self._in_part = False
        self._parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._begin,
                "on_header_field": self._piece(0),
                "on_header_value": self._piece(1),
                "on_header_end": self._header_end,
                "on_headers_finished": self._headers_done,
                "on_part_data": lambda data, start, end: self._events.append(
                    ("data", bytes(data[start:end]))
                ),
                "on_part_end": lambda: self._events.append(("end", b"")),
                "on_end": self._end,
            },
        )

    def _begin(self) -> None:
        self._headers, self._header, self._header_bytes = {}, [b"", b""], 0

    def _piece(self, which: int) -> Callable[[bytes, int, int], None]:
        def add(data: bytes, start: int, end: int) -> None:
            self._header_bytes += end - start
            if self._header_bytes > MAX_PART_HEADERS:
                raise BadRequest("a part's headers are too large")
            self._header[which] += data[start:end]

        return add

    def _header_end(self) -> None:
        self._headers[self._header[0].strip().lower()] = self._header[1].strip()
        self._header = [b"", b""]

    def _headers_done(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        filename = options.get(b"filename")
        decoded = filename.decode("utf-8", "replace") if filename is not None else None
        self._events.append(("part", f"{name}\0{decoded if decoded is not None else ''}".encode()))
        self._events.append(("file" if filename is not None else "field", b""))

    def _end(self) -> None:
        self._events.append(("done", b""))

    async def _event(self) -> tuple[str, bytes]:
        while not self._events:
            chunk = await anext(self._body, None)
            if chunk is None:
                raise BadRequest("the multipart body ends in the middle")
            if chunk:
                try:
                    self._parser.write(chunk)
                except MultipartParseError as exc:
                    raise BadRequest(f"the multipart body cannot be read: {exc}") from None
        return self._events.popleft()

    async def parts(self) -> AsyncIterator[Part]:
        count = passed_over = 0
        while True:
            if self._in_part:
                async for piece in self.data():  # not read: passed over, up to a bound
                    passed_over += len(piece)
                    if passed_over > MAX_PASSED_OVER:
                        raise PayloadTooLarge(
                            f"a multipart upload's fields are at most {MAX_PASSED_OVER} bytes"
                        )
            kind, value = await self._event()
            if kind == "done":
                return
            if kind != "part":
                continue
            name, _, filename = value.decode("utf-8", "replace").partition("\0")
            file_or_field, _ = await self._event()
            count += 1
            if count > MAX_PARTS:
                raise BadRequest(f"a multipart upload has at most {MAX_PARTS} parts")
            self._in_part = True
            yield Part(name, filename if file_or_field == "file" else None)

    async def data(self) -> AsyncIterator[bytes]:
        """The current part's bytes."""
        while self._in_part:
            kind, value = await self._event()
            if kind == "end":
                self._in_part = False
            elif kind == "data" and value:
                yield value


async def list_capped(
    node: NodeClient,
    sandbox_id: str,
    path: str,
    *,
    depth: int,
    user: str | None,
    cap: int,
) -> list[FileEntry]:
    """A whole listing, gathered a page at a time; ``PayloadTooLarge`` past ``cap``
    entries (never a silently cut list)."""
    entries: list[FileEntry] = []
    cursor: str | None = None
    while True:
        page = await node.list_dir(sandbox_id, path, depth=depth, user=user, cursor=cursor)
        entries += page.entries
        if len(entries) > cap:
            raise PayloadTooLarge(
                f"{path} holds more than {cap} entries down to depth {depth}: "
                "list a directory below it, or a smaller depth"
            )
        if page.next_cursor is None:
            return entries
        cursor = page.next_cursor
