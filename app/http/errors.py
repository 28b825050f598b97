"""The one place where exceptions become HTTP responses.

Every error body is ``{"error": {"code": ..., "message": ..., "details"?: ...}}`` with a
stable code from ``app.errors``. Unexpected exceptions become a 500 ``internal_error``
with no traceback (it is logged, with the request id, and re-raised for the server).
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app.errors import CorralError, MethodNotAllowed, NotFound

log = logging.getLogger(__name__)


def error_response(exc: CorralError) -> JSONResponse:
    body: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if exc.details is not None:
        body["details"] = exc.details
    return JSONResponse({"error": body}, status_code=exc.status, headers=exc.headers())


async def corral_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, CorralError)
    if exc.status >= 500:
        log.warning("%s %s: %s %s", request.method, request.url.path, exc.code, exc.message)
    return error_response(exc)


async def http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    mapped: CorralError
    if exc.status_code == 404:
        mapped = NotFound(f"no route {request.url.path}")
    elif exc.status_code == 405:
        mapped = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
    else:
        mapped = CorralError(str(exc.detail))
        mapped.status = exc.status_code  # type: ignore[misc]
    return error_response(mapped)


async def unhandled(request: Request, exc: Exception) -> Response:
    log.error("%s %s: unhandled %r", request.method, request.url.path, exc, exc_info=exc)
    return error_response(CorralError())


HANDLERS: dict[Any, Any] = {
    CorralError: corral_error,
    HTTPException: http_exception,
    Exception: unhandled,
}
