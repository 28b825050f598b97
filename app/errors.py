"""Corral's exception tree.

Every error that reaches a client is one of these; ``app.http.errors`` maps the tree
to HTTP in one place. Each class carries a stable ``code`` (part of the API contract:
never rename one) and an HTTP ``status``.

    CorralError                      500 internal_error
    ├── BadRequest                   400 bad_request
    │   ├── InvalidJSON              400 invalid_json        (also: lone UTF-16 surrogates)
    │   ├── TooDeeplyNested          400 too_deeply_nested
    │   ├── UnsupportedMediaType     415 unsupported_media_type
    │   ├── InvalidPath              400 invalid_path         (in a sandbox)
    │   └── ConflictingCredentials   400 conflicting_credentials  (two different keys)
    ├── ValidationFailed             422 validation_error
    │   ├── InputValidationFailed    422 input_validation_error   (a function's input)
    │   │   └── InputTooComplex      422 input_too_complex  (its validation's work bound)
    │   ├── InvalidInputSchema       422 invalid_input_schema     (a function's schema)
    │   ├── InvalidArtifact          422 invalid_artifact         (code or module)
    │   ├── InvalidDockerfile        422 invalid_dockerfile       (a tenant's build)
    │   └── BackendNotOffered        422 backend_not_offered      (no node offers it)
    ├── LimitTooHigh                 422 limit_too_high
    │   ├── LifetimeTooLong          422 lifetime_too_long   (a sandbox's expiry)
    │   └── SandboxTooLarge          422 sandbox_too_large   (a quota's or every node's)
    ├── PayloadTooLarge              413 payload_too_large
    ├── UploadStalled                408 upload_stalled       (no bytes for a while)
    ├── Unauthenticated              401 missing_api_key
    │   ├── InvalidApiKey            401 invalid_api_key
    │   └── NodeTokenRequired        401 missing_node_token   (/internal/: nodes only)
    ├── Forbidden                    403 forbidden
    │   ├── PermissionDenied         403 permission_denied    (a file call's user, in a sandbox)
    │   ├── AdminRequired            403 admin_required
    │   ├── TenantDisabled           403 tenant_disabled
    │   └── InvalidNodeToken         403 invalid_node_token
    ├── NotFound                     404 not_found
    │   ├── PathNotFound             404 path_not_found       (in a sandbox)
    │   ├── ArtifactNotFound         404 artifact_not_found   (nodes' artifact fetch)
    │   └── ImageNotFound            404 image_not_found
    ├── MethodNotAllowed             405 method_not_allowed
    ├── Conflict                     409 conflict
    │   └── SandboxNotRunning        409 sandbox_not_running  (paused or stopped)
    ├── QuotaExceeded                429 quota_exceeded      (Retry-After, RateLimit-*)
    │   ├── RateLimited              429 rate_limited
    │   ├── ConcurrencyLimited       429 concurrency_limited
    │   ├── CpuQuotaExhausted        429 cpu_quota_exhausted
    │   ├── StorageQuotaExhausted    429 storage_quota_exhausted
    │   ├── SandboxQuotaExhausted    429 sandbox_quota_exhausted  (live sandboxes' totals)
    │   ├── SnapshotQuotaExhausted   429 snapshot_quota_exhausted
    │   └── TooManyTransfers         429 too_many_transfers   (file transfers on a node)
    ├── Unavailable                  503 unavailable         (Retry-After)
    │   ├── NoCapacity               503 no_capacity
    │   ├── DatabaseUnavailable      503 database_unavailable
    │   ├── DispatchUnavailable      503 dispatch_unavailable
    │   ├── NodeUnavailable          503 node_unavailable     (the sandbox's node)
    │   ├── SandboxUnresponsive      503 sandbox_unresponsive (its init refused or is silent)
    │   ├── ImageFetchFailed         503 image_fetch_failed   (node from control plane)
    │   └── UnsupportedRuntime       400 unsupported_runtime
    ├── DiskFull                     507 disk_full            (a sandbox's disk or memory)
    ├── BuildFailed                  422 build_failed         (a step of a tenant's build)
    └── ExecutionTimeout             504 execution_timeout
"""

from __future__ import annotations

from typing import Any, ClassVar


class CorralError(Exception):
    """Base of every error Corral reports to a client."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    default_message: ClassVar[str] = "internal error"

    def __init__(self, message: str | None = None, *, details: Any = None) -> None:
        self.message = message or self.default_message
        self.details = details
        super().__init__(self.message)

    def headers(self) -> dict[str, str]:
        return {}


class BadRequest(CorralError):
    status, code, default_message = 400, "bad_request", "bad request"


class InvalidJSON(BadRequest):
    code, default_message = "invalid_json", "request body is not valid JSON"


class TooDeeplyNested(BadRequest):
    """A body nested deeper than the gateway parses (``app.http.jsonbody.MAX_DEPTH``), or
    a request whose processing recursed past the interpreter's limit."""

    code, default_message = "too_deeply_nested", "the request is nested too deeply"


class UnsupportedMediaType(BadRequest):
    status, code = 415, "unsupported_media_type"
    default_message = "request body must be application/json"


class ValidationFailed(CorralError):
    status, code, default_message = 422, "validation_error", "request failed validation"


class BackendNotOffered(ValidationFailed):
    """A sandbox asks for a backend no node offers (``details.offered``: the backends that
    are)."""

    code, default_message = "backend_not_offered", "no node offers this sandbox backend"


class InputValidationFailed(ValidationFailed):
    """A function's input does not match the JSON schema registered with it."""

    code, default_message = "input_validation_error", "input does not match the function's schema"


class InputTooComplex(InputValidationFailed):
    """Checking the input against the function's schema needs more work than one request
    may spend (``app.functions.budget``): a smaller input or a simpler schema passes."""

    code = "input_too_complex"
    default_message = "validating this input against the function's schema takes too much work"


class InvalidInputSchema(ValidationFailed):
    """The input schema given at registration is not a valid JSON Schema (2020-12)."""

    code, default_message = "invalid_input_schema", "input_schema is not a valid JSON Schema"


class InvalidArtifact(ValidationFailed):
    """A function's code or WebAssembly module cannot be used (syntax, imports, ...)."""

    code, default_message = "invalid_artifact", "the function's code or module is not usable"


class InvalidDockerfile(ValidationFailed):
    """A Dockerfile a tenant's build cannot run: outside the supported subset, or FROM an
    image the tenant cannot use; refused before anything is built."""

    code, default_message = "invalid_dockerfile", "the Dockerfile cannot be built"


class LimitTooHigh(CorralError):
    status, code, default_message = 422, "limit_too_high", "a requested limit exceeds the quota"


class LifetimeTooLong(LimitTooHigh):
    """A sandbox would end later than its creation plus the tenant's
    ``max_sandbox_lifetime_seconds`` (a create's ``ttl_s``, a timeout that extends it)."""

    code = "lifetime_too_long"
    default_message = "the sandbox would outlive the tenant's max_sandbox_lifetime_seconds"


class SandboxTooLarge(LimitTooHigh):
    """A sandbox asks more memory, CPU or disk than one sandbox of the tenant may have
    (``details.quota`` names the field: ``max_sandbox_memory_mb``, ...), or more than any
    node gives its sandboxes (``details.quota`` is None, ``details.largest`` says what
    the largest node could hold)."""

    code = "sandbox_too_large"
    default_message = "the sandbox asks more than one sandbox may have"


class PayloadTooLarge(CorralError):
    status, code, default_message = 413, "payload_too_large", "request body is too large"


class UploadStalled(CorralError):
    status, code, default_message = 408, "upload_stalled", "the upload stopped sending"


class Unauthenticated(CorralError):
    status, code, default_message = 401, "missing_api_key", "an API key is required"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="corral"'}


class InvalidApiKey(Unauthenticated):
    code, default_message = "invalid_api_key", "the API key is not valid"


class Forbidden(CorralError):
    status, code, default_message = 403, "forbidden", "forbidden"


class PermissionDenied(Forbidden):
    """A file call in a sandbox acts as a user (the sandbox's default, or the one named)
    who may not do it: the kernel said so, inside the sandbox."""

    code, default_message = "permission_denied", "the user the call acts as may not do this"


class AdminRequired(Forbidden):
    code, default_message = "admin_required", "this endpoint needs the admin key"


class TenantDisabled(Forbidden):
    code, default_message = "tenant_disabled", "the tenant is disabled"


class NodeTokenRequired(Unauthenticated):
    """A node-only endpoint (``/internal/``) was called without the node token."""

    code, default_message = "missing_node_token", "the node token is required"


class InvalidNodeToken(Forbidden):
    """The token presented to a node-only endpoint is not this gateway's node token (or
    the gateway has none, so nothing matches)."""

    code, default_message = "invalid_node_token", "the node token is not valid"


class NotFound(CorralError):
    status, code, default_message = 404, "not_found", "not found"


class PathNotFound(NotFound):
    code, default_message = "path_not_found", "no such file or directory in the sandbox"


class ArtifactNotFound(NotFound):
    code, default_message = "artifact_not_found", "no function artifact of that tenant and hash"


class ImageNotFound(NotFound):
    code, default_message = "image_not_found", "no such image"


class InvalidPath(BadRequest):
    code, default_message = "invalid_path", "the path cannot be used in the sandbox"


class ConflictingCredentials(BadRequest):
    """A request presents two different credentials (``X-API-Key`` and ``Authorization:
    Bearer``, or two ``Authorization`` headers): which one it means is not guessed
    (``app.auth.credentials``)."""

    code = "conflicting_credentials"
    default_message = "the request carries two different credentials: send one"


class InvalidNetwork(BadRequest):
    code, default_message = "invalid_network", "the sandbox's network allow list cannot be used"


class MethodNotAllowed(CorralError):
    status, code, default_message = 405, "method_not_allowed", "method not allowed"


class Conflict(CorralError):
    status, code, default_message = 409, "conflict", "conflict"


class SandboxNotRunning(Conflict):
    code, default_message = "sandbox_not_running", "the sandbox is not running"


class QuotaExceeded(CorralError):
    status, code, default_message = 429, "quota_exceeded", "quota exceeded"

    def __init__(
        self,
        message: str | None = None,
        *,
        retry_after: float = 1.0,
        details: Any = None,
        limit: float | None = None,
    ) -> None:
        super().__init__(message, details=details)
        self.retry_after = retry_after
        self.limit = limit  #: the quota's value, shown as ``RateLimit-Limit``

    def headers(self) -> dict[str, str]:
        seconds = str(max(1, round(self.retry_after + 0.49)))
        if self.limit is None:
            return {"Retry-After": seconds}
        limit = f"{self.limit:g}" if self.limit != int(self.limit) else str(int(self.limit))
        return {
            "Retry-After": seconds,
            "RateLimit-Limit": limit,
            "RateLimit-Remaining": "0",
            "RateLimit-Reset": seconds,
        }


class WatcherQuotaExceeded(QuotaExceeded):
    code, default_message = "watcher_quota_exceeded", "the tenant holds its most watchers"


class RateLimited(QuotaExceeded):
    code, default_message = "rate_limited", "executions-per-second quota exceeded"


class ConcurrencyLimited(QuotaExceeded):
    code = "concurrency_limited"
    default_message = "concurrency quota exceeded and the admission queue wait ran out"


class CpuQuotaExhausted(QuotaExceeded):
    code, default_message = "cpu_quota_exhausted", "daily CPU-seconds quota is used up"


class TooManyTransfers(QuotaExceeded):
    """The tenant (or the sandbox's node) has its most file transfers running."""

    code, default_message = "too_many_transfers", "too many file transfers at once; retry"


class StorageQuotaExhausted(QuotaExceeded):
    code, default_message = (
        "storage_quota_exhausted",
        "the storage quota is used up until some large outputs outlive their retention or "
        "snapshots are deleted",
    )


class SandboxQuotaExhausted(QuotaExceeded):
    """The tenant's live sandboxes hold what its quota allows of memory, CPU or disk
    together (``details.quota`` names the field: ``max_sandboxes_memory_mb``, ...)."""

    code = "sandbox_quota_exhausted"
    default_message = "the tenant's live sandboxes hold what its quota allows"


class SnapshotQuotaExhausted(QuotaExceeded):
    """The tenant keeps ``max_snapshots`` snapshots: delete some first."""

    code = "snapshot_quota_exhausted"
    default_message = "the tenant keeps as many snapshots as its quota allows"


class Unavailable(CorralError):
    status, code, default_message = 503, "unavailable", "service unavailable"

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"} if self.status == 503 else {}


class DatabaseUnavailable(Unavailable):
    """The database cannot be reached (restarting, failing over); nothing was started,
    unless ``details`` says ``"recorded": "unknown"``: the connection was lost while an
    invocation (``details.invocation_id``) was being committed, and whether it was stored
    (and will run) is known only once the database is back."""

    code, default_message = "database_unavailable", "the database is unreachable; retry"


class DispatchUnavailable(Unavailable):
    """Redis (dispatch, quota counters, the node catalogue) cannot be reached."""

    code, default_message = "dispatch_unavailable", "the dispatch queue is unreachable; retry"


class NodeUnavailable(Unavailable):
    code, default_message = "node_unavailable", "the node that holds the sandbox cannot be reached"


class SandboxUnresponsive(Unavailable):
    """The sandbox's init could not start the call (its processes are at their limit) or
    did not answer in time."""

    code, default_message = "sandbox_unresponsive", "the sandbox did not answer in time"


class BackendUnavailable(Unavailable):
    code, default_message = "backend_unavailable", "the node cannot give this sandbox what it asks"


class ImageFetchFailed(Unavailable):
    """The node lacks the image and could not fetch it from the control plane."""

    code, default_message = "image_fetch_failed", "the node could not fetch the image"


class NoCapacity(Unavailable):
    code, default_message = "no_capacity", "no node can take this execution now"


class UnsupportedRuntime(Unavailable):
    status, code = 400, "unsupported_runtime"
    default_message = "no node offers this runtime or language"


class Unsupported(CorralError):
    status, code, default_message = 501, "unsupported", "the sandbox's backend cannot do this"


class DiskFull(CorralError):
    """A write found the sandbox's disk (or the memory its RAM disk counts against) full."""

    status, code, default_message = 507, "disk_full", "the sandbox's disk is full"


class BuildFailed(CorralError):
    """A step of a tenant's image build failed (a RUN's exit status, a COPY's source): the
    last line of a build's log, never an answer's status (the log had started)."""

    status, code, default_message = 422, "build_failed", "the image build failed"


class ExecutionTimeout(CorralError):
    status, code = 504, "execution_timeout"
    default_message = "the execution did not finish in time; its result will be stored"
