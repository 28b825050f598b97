"""Raw ASGI middleware: request body size limit and request metrics."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import PayloadTooLarge
from app.http.errors import error_response

if TYPE_CHECKING:
    from app.metrics import Metrics


#: file uploads: their bodies stream to a sandbox's node and are bounded there, by a
#: file's maximum (``max_file_bytes``) and the sandbox's disk, never by ``max_body_bytes``
UPLOADS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("PUT", re.compile(r"/v1/sandboxes/[^/]+/files")),  # Corral's write
    ("POST", re.compile(r"/files")),  # E2B envd's upload
    ("PUT", re.compile(r"/console/sandboxes/[^/]+/files")),  # the console's, the same write
)


def is_upload(scope: Scope) -> bool:
    """Whether a request is one of the file uploads (``UPLOADS``)."""
    method, path = scope["method"], scope["path"]
    return any(method == m and pattern.fullmatch(path) for m, pattern in UPLOADS)


class BodySizeLimit:
    """Refuse bodies over ``limit`` bytes, by Content-Length or as they stream in; a file
    upload (``is_upload``) is passed on unbounded here (its handler bounds it)."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_upload(scope):
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.limit:
                    await self._refuse(scope, receive, send)
                    return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise PayloadTooLarge(f"request body is over {self.limit} bytes")
            return message

        await self.app(scope, limited, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(PayloadTooLarge(f"request body is over {self.limit} bytes"))
        await response(scope, receive, send)


class RequestMetrics:
    """Count requests and time them by route template (never by raw path)."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            route = _route_template(scope)
            self.metrics.observe_request(
                scope["method"], route, status, time.perf_counter() - started
            )


def _route_template(scope: Scope) -> str:
    router = scope.get("router") or getattr(scope.get("app"), "router", None)
    routes = getattr(router, "routes", [])
    # the route the router chose for this request (it stores it in the scope), when it is
    # one of the router's own and it took the method (a full match): no second matching
    # of every route's pattern, which was 2 % of a busy gateway's event loop
    chosen = scope.get("route")
    if chosen is not None and any(route is chosen for route in routes):
        methods = getattr(chosen, "methods", None)
        if methods is None or scope["method"] in methods:
            return str(getattr(chosen, "path", "other"))
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return str(getattr(route, "path", "other"))
    return "unmatched"
