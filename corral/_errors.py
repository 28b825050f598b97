"""The SDK's exception tree: one class per family of the API's stable error codes.

Every failure the SDK reports is a ``CorralError``; ``code`` is the API's own code (a
subclass can stand for several: ``QuotaExceeded`` for ``rate_limited`` too), ``status``
the HTTP status (``None`` when no answer came).

    CorralError                      any error; the API's 500 internal_error
    ├── CorralConnectionError        no answer: refused, reset, timed out (status None)
    ├── UnexpectedResponse           an answer that is not Corral's (a proxy's page)
    ├── BadRequest                   400 bad_request, invalid_json, unsupported_runtime, ...
    │   └── InvalidPath              400 invalid_path
    ├── ValidationFailed             422 validation_error, limit_too_high, ...
    ├── PayloadTooLarge              413 payload_too_large
    ├── Unauthenticated              401 missing_api_key, invalid_api_key
    ├── Forbidden                    403 forbidden, admin_required, tenant_disabled
    ├── NotFound                     404 not_found
    │   ├── PathNotFound             404 path_not_found
    │   └── ImageNotFound            404 image_not_found
    ├── Conflict                     409 conflict
    │   └── SandboxNotRunning        409 sandbox_not_running
    ├── QuotaExceeded                429 quota_exceeded, rate_limited, ... (retry_after)
    │   └── ConcurrencyLimited       429 concurrency_limited
    ├── Unavailable                  503 unavailable, database_unavailable, ... (retry_after)
    │   ├── NoCapacity               503 no_capacity
    │   └── NodeUnavailable          503 node_unavailable
    ├── ExecutionTimeout             504 execution_timeout
    └── BuildFailed                  a step of an image build (the log's last line)
"""

from __future__ import annotations

from typing import Any, ClassVar

import httpx


class CorralError(Exception):
    """An error reported by Corral (or the failure to reach it)."""

    default_code: ClassVar[str] = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        details: Any = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.status = status
        self.details = details
        self.retry_after = retry_after

    def __str__(self) -> str:
        prefix = f"{self.status} " if self.status is not None else ""
        return f"{prefix}{self.code}: {self.message}"


class CorralConnectionError(CorralError):
    default_code = "connection_error"


class UnexpectedResponse(CorralError):
    default_code = "unexpected_response"


class BadRequest(CorralError):
    default_code = "bad_request"


class InvalidPath(BadRequest):
    default_code = "invalid_path"


class ValidationFailed(CorralError):
    default_code = "validation_error"


class PayloadTooLarge(CorralError):
    default_code = "payload_too_large"


class Unauthenticated(CorralError):
    default_code = "missing_api_key"


class Forbidden(CorralError):
    default_code = "forbidden"


class NotFound(CorralError):
    default_code = "not_found"


class PathNotFound(NotFound):
    default_code = "path_not_found"


class ImageNotFound(NotFound):
    default_code = "image_not_found"


class Conflict(CorralError):
    default_code = "conflict"


class SandboxNotRunning(Conflict):
    default_code = "sandbox_not_running"


class QuotaExceeded(CorralError):
    default_code = "quota_exceeded"


class ConcurrencyLimited(QuotaExceeded):
    default_code = "concurrency_limited"


class Unavailable(CorralError):
    default_code = "unavailable"


class NoCapacity(Unavailable):
    default_code = "no_capacity"


class NodeUnavailable(Unavailable):
    default_code = "node_unavailable"


class ExecutionTimeout(CorralError):
    default_code = "execution_timeout"


#: Codes with a class of their own; any other code is classed by its status.
class BuildFailed(CorralError):
    """A step of ``images.build`` failed (a RUN's exit status, a COPY's source)."""

    default_code = "build_failed"


BY_CODE: dict[str, type[CorralError]] = {
    cls.default_code: cls
    for cls in (
        InvalidPath,
        PathNotFound,
        ImageNotFound,
        SandboxNotRunning,
        ConcurrencyLimited,
        NoCapacity,
        NodeUnavailable,
        BuildFailed,
    )
}
BY_STATUS: dict[int, type[CorralError]] = {
    400: BadRequest,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    415: BadRequest,
    422: ValidationFailed,
    429: QuotaExceeded,
    503: Unavailable,
    504: ExecutionTimeout,
}


def error_from_response(response: httpx.Response) -> CorralError:
    """The exception for an error answer (its body already read): Corral's
    ``{"error": {"code", "message", "details"?}}``, or ``UnexpectedResponse``."""
    status = response.status_code
    try:
        body = response.json()
        error = body["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        text = response.text[:200]
        return UnexpectedResponse(
            f"not a Corral answer: {text!r}", status=status, code="unexpected_response"
        )
    cls = BY_CODE.get(code) or BY_STATUS.get(status, CorralError)
    return cls(
        message,
        code=code,
        status=status,
        details=error.get("details"),
        retry_after=_retry_after(response),
    )


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def connection_error(exc: httpx.HTTPError, url: str) -> CorralConnectionError:
    kind = "timed out" if isinstance(exc, httpx.TimeoutException) else "cannot reach"
    return CorralConnectionError(f"{kind} {url}: {exc or type(exc).__name__}")
