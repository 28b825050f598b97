"""A node's HTTP app reached from its own process without a socket.

A node embedded in ``corral serve`` listens on a Unix socket, and the gateway in the
same process used to reach it through that socket: each exec paid a second HTTP server
(uvicorn's protocol), an HTTP client connection (httpcore, h11) and the socket's system
calls on both ends. ``published(address, app)`` records the node's ASGI app under the
address it advertises for as long as it serves there; ``transport_for(address)`` then
gives a client in the same process an ``httpx`` transport that calls the app directly.
The requests, routes, node token and answers are the same as over the socket: only the
bytes do not leave the process. An address not published here (a node in another
process, on another host) is reached over the network as before.

``LocalTransport`` streams both ways: the request body is handed to the app chunk by
chunk, the answer's body reaches the client as the app sends it, through a bounded queue
(a slow reader holds the app back, as a full socket would). The client's read timeout
applies to each wait for the answer's head and for each chunk. Closing the answer early
tells the app that the client went away (ASGI 2.4: its next ``send`` raises ``OSError``,
``receive`` answers ``http.disconnect``) and cancels the app's task if it is still
running; so does cancelling the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator, MutableMapping
from typing import Any
from urllib.parse import unquote

import httpx

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]

#: chunks of an answer's body held between the app and a reader that is behind
QUEUE_CHUNKS = 16

_apps: dict[str, Any] = {}


@contextlib.contextmanager
def published(address: str, app: Any) -> Iterator[None]:
    """``app`` answers for ``address`` in this process while the block runs."""
    if address in _apps:
        raise RuntimeError(f"{address} is already served in this process")
    _apps[address] = app
    try:
        yield
    finally:
        _apps.pop(address, None)


def transport_for(address: str) -> LocalTransport | None:
    """A transport to the app published at ``address`` in this process, if there is one."""
    return LocalTransport(address) if address in _apps else None


class _End:
    """The answer's body is complete."""


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class LocalTransport(httpx.AsyncBaseTransport):
    """Sends each request to the ASGI app published at ``address`` (looked up per
    request: once the node stops serving, requests fail as a closed socket would)."""

    def __init__(self, address: str) -> None:
        self.address = address

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        app = _apps.get(self.address)
        if app is None:
            raise httpx.ConnectError(f"{self.address} is not served any more", request=request)
        timeouts = request.extensions.get("timeout") or {}
        exchange = _Exchange(app, request, timeouts.get("read"))
        status, headers = await exchange.start()
        return httpx.Response(status, headers=headers, stream=exchange, request=request)


class _Exchange(httpx.AsyncByteStream):
    """One request's run of the app, and the answer's body as the app sends it."""

    def __init__(self, app: Any, request: httpx.Request, read_s: float | None) -> None:
        self._app = app
        self._request = request
        self._read_s = read_s
        self._head: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] = (
            asyncio.get_running_loop().create_future()
        )
        self._body: asyncio.Queue[bytes | _End | _Failed] = asyncio.Queue(QUEUE_CHUNKS)
        self._gone = asyncio.Event()  # the client closed the answer
        self._chunks: AsyncIterator[bytes] | None = aiter(request.stream)  # type: ignore[arg-type]
        self._next: bytes | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> tuple[int, list[tuple[bytes, bytes]]]:
        self._task = asyncio.create_task(self._run(), name=f"local-http {self._request.url.path}")
        try:
            async with asyncio.timeout(self._read_s):
                return await asyncio.shield(self._head)
        except TimeoutError:
            await self.aclose()
            raise httpx.ReadTimeout("no answer in time", request=self._request) from None
        except BaseException:
            await self.aclose()
            raise

    async def _run(self) -> None:
        try:
            await self._app(self._scope(), self._receive, self._send)
        except Exception as exc:
            if self._gone.is_set():
                return  # the client went away: what the app did next is nobody's answer
            if not self._head.done():
                self._head.set_exception(
                    httpx.RemoteProtocolError(f"the app failed: {exc!r}", request=self._request)
                )
            else:
                log.warning(
                    "%s: the app failed after answering: %r",
                    self._request.url.path,
                    exc,
                    exc_info=exc,
                )
                await self._put(_Failed(exc))
            return
        if not self._head.done():
            self._head.set_exception(
                httpx.RemoteProtocolError("the app ended without answering", request=self._request)
            )
        else:
            await self._put(_End())

    def _scope(self) -> Scope:
        url = self._request.url
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "method": self._request.method,
            "scheme": url.scheme,
            "path": unquote(url.path),
            "raw_path": url.raw_path.split(b"?", 1)[0],
            "query_string": url.query,
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in self._request.headers.raw],
            "client": None,
            "server": None,
            "extensions": {},
        }

    async def _receive(self) -> Message:
        if self._chunks is not None:
            chunk = self._next if self._next is not None else await anext(self._chunks, b"")
            self._next = await anext(self._chunks, None) if chunk else None
            if self._next is None:
                self._chunks = None
            return {"type": "http.request", "body": chunk, "more_body": self._next is not None}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        if self._gone.is_set():
            raise OSError("the client closed the answer")
        kind = message["type"]
        if kind == "http.response.start":
            self._head.set_result((int(message["status"]), list(message.get("headers", []))))
        elif kind == "http.response.body":
            body = bytes(message.get("body", b""))
            if body:
                await self._put(body)

    async def _put(self, item: bytes | _End | _Failed) -> None:
        if not self._gone.is_set():
            await self._body.put(item)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            try:
                async with asyncio.timeout(self._read_s):
                    item = await self._body.get()
            except TimeoutError:
                raise httpx.ReadTimeout("the answer stalled", request=self._request) from None
            if isinstance(item, _End):
                return
            if isinstance(item, _Failed):
                raise httpx.RemoteProtocolError(
                    f"the answer was cut: {item.exc!r}", request=self._request
                )
            yield item

    async def aclose(self) -> None:
        self._gone.set()
        task, self._task = self._task, None
        if task is None:
            return
        if not task.done():
            with contextlib.suppress(asyncio.QueueEmpty):
                while True:  # a sender blocked on a full queue sees the client gone
                    self._body.get_nowait()
            await asyncio.sleep(0)
            if not task.done():
                task.cancel()
        with contextlib.suppress(BaseException):
            await task
