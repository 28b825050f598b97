"""The one place where exceptions become HTTP responses.

Every error body is ``{"error": {"code": ..., "message": ..., "details"?: ...}}`` with a
stable code from ``app.errors``. A database or Redis that cannot be reached (a restart,
a failover) is a 503 with ``Retry-After``, never a 500: ``database_unavailable`` or
``dispatch_unavailable``. A ``RecursionError`` that escapes (input is bounded so that
none should: ``app.http.jsonbody``, ``app.functions.bounds``) is a 400
``too_deeply_nested`` logged as one line, never a traceback thousands of lines long.
Other unexpected exceptions become a 500 ``internal_error`` (its traceback logged, and
re-raised for the server; never sent to the client).
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app.db.failures import is_connection_failure
from app.errors import (
    CorralError,
    DatabaseUnavailable,
    DispatchUnavailable,
    MethodNotAllowed,
    NotFound,
    TooDeeplyNested,
)

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


async def database_down(request: Request, exc: Exception) -> Response:
    if not is_connection_failure(exc):
        return await unhandled(request, exc)
    log.warning("%s %s: database unreachable: %r", request.method, request.url.path, exc)
    return error_response(DatabaseUnavailable())


async def redis_down(request: Request, exc: Exception) -> Response:
    log.warning("%s %s: redis unreachable: %r", request.method, request.url.path, exc)
    return error_response(DispatchUnavailable())


async def connection_down(request: Request, exc: Exception) -> Response:
    """A bare ``ConnectionError`` is the database's: asyncpg raises the OS error of a
    connect that failed unwrapped, while redis-py wraps its own in ``RedisConnectionError``."""
    log.warning("%s %s: database unreachable: %r", request.method, request.url.path, exc)
    return error_response(DatabaseUnavailable())


async def too_deep(request: Request, exc: Exception) -> Response:
    """One line, without the traceback: a deep recursion's is thousands of lines long."""
    log.warning("%s %s: recursion too deep, answered 400", request.method, request.url.path)
    return error_response(TooDeeplyNested("the request is nested too deeply to process"))


async def unhandled(request: Request, exc: Exception) -> Response:
    log.error("%s %s: unhandled %r", request.method, request.url.path, exc, exc_info=exc)
    return error_response(CorralError())


HANDLERS: dict[Any, Any] = {
    CorralError: corral_error,
    HTTPException: http_exception,
    DBAPIError: database_down,
    RedisConnectionError: redis_down,
    RedisTimeoutError: redis_down,
    ConnectionError: connection_down,
    RecursionError: too_deep,
    Exception: unhandled,
}
