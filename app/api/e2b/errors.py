"""How the E2B routes answer errors: the one place ``app.errors`` meets E2B's shapes.

The E2B SDKs parse three kinds of error, by the surface they called:

    control plane (/sandboxes, /v2/sandboxes)   HTTP status, {"code": <status>, "message"}
    envd HTTP (/files, /health)                 HTTP status, {"code": <status>, "message"}
    envd Connect-RPC (process, filesystem)      Connect code: unary {"code": "not_found",
                                                "message"} with the code's HTTP status;
                                                streams an end-of-stream frame {"error"}
    code interpreter (/execute, /contexts)      HTTP status, text body

A sandbox that stopped (or is paused) answers as E2B's edge does for a sandbox it no
longer has: 502 (Connect ``unavailable``) with a message containing "was not found", which
the SDK turns into ``SandboxNotRunningException``. Another tenant's sandbox is 404
``not_found``: whether it exists is not told. Everything else keeps the status of its
``CorralError``; anything that is not one (bad JSON, a bad value) is mapped to one here,
so no input reaches a 500. A limit over the tenant's quota (a sandbox's lifetime) is a 400,
as E2B answers a timeout over the plan's maximum. A file call its user may not make is
``permission_denied`` (REST 403), a full disk ``resource_exhausted`` (REST 507, as envd),
too many transfers at once ``resource_exhausted`` (REST 429).
"""

from __future__ import annotations

import binascii
import json
import logging
from collections.abc import Awaitable, Callable

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from app.errors import (
    BadRequest,
    Conflict,
    CorralError,
    DiskFull,
    ExecutionTimeout,
    Forbidden,
    LimitTooHigh,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    SandboxNotRunning,
    Unauthenticated,
    Unavailable,
    Unsupported,
    ValidationFailed,
)
from common.logsafe import loggable

log = logging.getLogger(__name__)


class NotSupported(CorralError):
    """Part of the E2B API Corral does not offer (PTYs, volumes, templates, ...)."""

    status, code, default_message = 501, "not_supported", "not supported by Corral"


class SandboxGone(SandboxNotRunning):
    """The sandbox exists for this tenant but is not running (stopped or paused)."""

    status = 502


#: Connect code -> HTTP status of a unary error (the Connect protocol's table)
CONNECT_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "unauthenticated": 401,
}


def as_corral(exc: Exception) -> CorralError:
    """Any error a route can meet, as one of ours (bad input is a 400, never a 500)."""
    if isinstance(exc, SandboxNotRunning) and not isinstance(exc, SandboxGone):
        return SandboxGone(f"the sandbox was not found running: {exc.message}")
    if isinstance(exc, LimitTooHigh):
        return BadRequest(exc.message)  # E2B: a timeout over the plan's maximum is a 400
    if isinstance(exc, CorralError):
        return exc
    if isinstance(exc, ValidationError):
        detail = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        return BadRequest(detail)
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError, binascii.Error)):
        return BadRequest(f"the body cannot be read: {exc}")
    if isinstance(exc, (ValueError, KeyError, TypeError)):
        return BadRequest(f"bad request: {exc}")
    raise exc


def connect_code(exc: CorralError) -> str:
    if isinstance(exc, SandboxNotRunning):
        return "unavailable"
    table: list[tuple[type[CorralError], str]] = [
        (NotSupported, "unimplemented"),
        (Unsupported, "unimplemented"),
        (Unauthenticated, "unauthenticated"),
        (Forbidden, "permission_denied"),
        (NotFound, "not_found"),
        (Conflict, "already_exists"),
        (BadRequest, "invalid_argument"),
        (ValidationFailed, "invalid_argument"),
        (PayloadTooLarge, "resource_exhausted"),
        (DiskFull, "resource_exhausted"),
        (QuotaExceeded, "resource_exhausted"),
        (Unavailable, "unavailable"),
        (ExecutionTimeout, "deadline_exceeded"),
    ]
    for kind, code in table:
        if isinstance(exc, kind):
            return code
    return "internal"


def _logged(exc: CorralError, surface: str) -> None:
    if exc.status >= 500 and not isinstance(exc, (SandboxGone, NotSupported)):
        log.warning("e2b %s: %s %s", surface, exc.code, loggable(exc.message))


def connect_error_body(exc: CorralError) -> dict[str, str]:
    return {"code": connect_code(exc), "message": exc.message}


def connect_unary_error(exc: Exception) -> Response:
    error = as_corral(exc)
    _logged(error, "rpc")
    body = connect_error_body(error)
    return JSONResponse(body, status_code=CONNECT_STATUS[body["code"]], headers=error.headers())


def rest_error(exc: Exception) -> Response:
    """Control plane and envd HTTP: E2B's ``Error`` object."""
    error = as_corral(exc)
    _logged(error, "api")
    return JSONResponse(
        {"code": error.status, "message": error.message},
        status_code=error.status,
        headers=error.headers(),
    )


def interpreter_error(exc: Exception) -> Response:
    error = as_corral(exc)
    _logged(error, "interpreter")
    return PlainTextResponse(error.message, status_code=error.status, headers=error.headers())


Handler = Callable[[Request], Awaitable[Response]]


def guarded(handler: Handler, answer: Callable[[Exception], Response]) -> Handler:
    """``handler``, its errors answered by ``answer`` (one of the shapes above)."""

    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:
            return answer(exc)

    run.__name__ = handler.__name__
    return run
