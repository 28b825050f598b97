"""The Connect protocol, as much of it as the E2B SDKs speak to envd, with the JSON codec.

Unary calls: ``POST /<package.Service>/<Method>`` with ``Content-Type: application/json``
and the request message as the body; the answer is the response message as JSON (200),
or an error object ``{"code", "message"}`` with the code's HTTP status.

Streams (server and client streaming): ``Content-Type: application/connect+json``; each
message travels in an envelope: one flags byte (0x01 compressed, 0x02 end of stream), a
big-endian uint32 length, then the JSON. A response stream is 200 and ends with an
end-of-stream envelope holding ``{}`` or ``{"error": {...}}``: an error after the
stream began, or before it (the SDK reads both the same way).

Messages are plain dicts in protobuf's JSON mapping (lowerCamelCase names, bytes as
base64, 64-bit integers as strings, enums by name); the SDK's decoder ignores fields it
does not know. The binary codec (``+proto``) and compression are refused: the SDKs send
neither.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from app.api.e2b.errors import NotSupported, as_corral, connect_error_body
from app.errors import BadRequest, CorralError, PayloadTooLarge
from common.logsafe import loggable

log = logging.getLogger(__name__)

Message = dict[str, Any]

FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02
_HEADER = struct.Struct(">BI")
MAX_MESSAGE_BYTES = 4 << 20
UNARY_TYPE = "application/json"
STREAM_TYPE = "application/connect+json"


def envelope(message: Message, flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(flags, len(data)) + data


def end_of_stream(error: CorralError | None = None) -> bytes:
    return envelope({"error": connect_error_body(error)} if error else {}, FLAG_END_STREAM)


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "").partition(";")[0].strip().lower()


def _object(data: bytes) -> Message:
    message = json.loads(data or b"{}")
    if not isinstance(message, dict):
        raise BadRequest("a message must be a JSON object")
    return message


async def json_body(request: Request, *, limit: int) -> Message:
    """A plain (REST) request's JSON object body, at most ``limit`` bytes."""
    data = await request.body()
    if len(data) > limit:
        raise PayloadTooLarge(f"the body is over {limit} bytes")
    return _object(data)


def timeout_s(request: Request) -> float | None:
    """The call's deadline (``Connect-Timeout-Ms``), None when it has none."""
    value = request.headers.get("connect-timeout-ms")
    if not value:
        return None
    try:
        ms = int(value)
    except ValueError:
        raise BadRequest("Connect-Timeout-Ms must be an integer") from None
    return ms / 1000 if ms > 0 else None


async def unary_request(request: Request) -> Message:
    if _content_type(request) != UNARY_TYPE:
        raise NotSupported("only the JSON codec (application/json) is served")
    if request.headers.get("content-encoding", "identity") != "identity":
        raise NotSupported("compressed requests are not served")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_MESSAGE_BYTES:
            raise PayloadTooLarge(f"a message is at most {MAX_MESSAGE_BYTES} bytes")
    return _object(body)


async def stream_requests(request: Request) -> AsyncIterator[Message]:
    """The enveloped messages of a streaming request, as they arrive."""
    if _content_type(request) != STREAM_TYPE:
        raise NotSupported("only the JSON codec (application/connect+json) is served")
    buffer = b""
    async for chunk in request.stream():
        buffer += chunk
        while len(buffer) >= _HEADER.size:
            flags, size = _HEADER.unpack_from(buffer)
            if size > MAX_MESSAGE_BYTES:
                raise PayloadTooLarge(f"a message is at most {MAX_MESSAGE_BYTES} bytes")
            if len(buffer) < _HEADER.size + size:
                break
            data, buffer = buffer[_HEADER.size : _HEADER.size + size], buffer[_HEADER.size + size :]
            if flags & FLAG_COMPRESSED:
                raise NotSupported("compressed messages are not served")
            if flags & FLAG_END_STREAM:
                return
            yield _object(data)
    if buffer:
        raise BadRequest("the request stream ends inside a message")


async def first_request(request: Request) -> Message:
    """The one request message of a server-streaming call."""
    async for message in stream_requests(request):
        return message
    raise BadRequest("the stream carries no request message")


def unary_response(message: Message) -> Response:
    return JSONResponse(message)


def stream_response(messages: AsyncIterator[Message]) -> Response:
    """200 and the messages as they come, then the end of the stream (with the error
    that ended it, if one did)."""

    async def frames() -> AsyncIterator[bytes]:
        error: CorralError | None = None
        try:
            async for message in messages:
                yield envelope(message)
        except Exception as exc:
            error = as_corral(exc)
            if error.status >= 500:
                log.info("e2b stream ended: %s %s", error.code, loggable(error.message))
        yield end_of_stream(error)

    return StreamingResponse(frames(), media_type=STREAM_TYPE)


def stream_error(exc: Exception) -> Response:
    """A streaming call that failed before it started."""
    error = as_corral(exc)
    return Response(end_of_stream(error), media_type=STREAM_TYPE)
