"""Corral's Python SDK: stateful sandboxes for agents and RL trainers.

    from corral import Corral

    with Corral() as client, client.sandboxes.create("python") as sbx:
        sbx.files.write("/home/user/main.py", "print(6 * 7)")
        print(sbx.exec(["python3", "main.py"]).stdout)  # runs in the user's home

Beyond sandboxes: ``client.run()`` (one program, once), ``client.functions`` (tool
functions), ``client.usage()``, and with the admin key ``client.tenants`` and
``client.keys``; these answer the API's JSON as it came.

``Corral`` (``AsyncCorral`` for asyncio) reads ``CORRAL_URL`` and ``CORRAL_API_KEY``
unless given ``url`` and ``api_key``. It depends on httpx and the standard library only.
"""

from corral._client import AsyncCorral, AsyncSandboxes, Corral, Sandboxes
from corral._errors import (
    BadRequest,
    BuildFailed,
    ConcurrencyLimited,
    Conflict,
    CorralConnectionError,
    CorralError,
    ExecutionTimeout,
    Forbidden,
    ImageNotFound,
    InvalidPath,
    NoCapacity,
    NodeUnavailable,
    NotFound,
    PathNotFound,
    PayloadTooLarge,
    QuotaExceeded,
    SandboxNotRunning,
    Unauthenticated,
    Unavailable,
    UnexpectedResponse,
    ValidationFailed,
)
from corral._models import ExecResult, FileEntry, SandboxInfo, Timings
from corral._resources import (
    AsyncFunctions,
    AsyncInvocations,
    AsyncKeys,
    AsyncTenants,
    Functions,
    Invocations,
    Keys,
    Tenants,
)
from corral._sandbox import AsyncFiles, AsyncSandbox, Files, Sandbox
from corral._terminal import AsyncTerminal

__all__ = [
    "AsyncCorral",
    "AsyncFiles",
    "AsyncFunctions",
    "AsyncInvocations",
    "AsyncKeys",
    "AsyncSandbox",
    "AsyncSandboxes",
    "AsyncTenants",
    "AsyncTerminal",
    "BadRequest",
    "BuildFailed",
    "ConcurrencyLimited",
    "Conflict",
    "Corral",
    "CorralConnectionError",
    "CorralError",
    "ExecResult",
    "ExecutionTimeout",
    "FileEntry",
    "Files",
    "Forbidden",
    "Functions",
    "ImageNotFound",
    "InvalidPath",
    "Invocations",
    "Keys",
    "NoCapacity",
    "NodeUnavailable",
    "NotFound",
    "PathNotFound",
    "PayloadTooLarge",
    "QuotaExceeded",
    "Sandbox",
    "SandboxInfo",
    "SandboxNotRunning",
    "Sandboxes",
    "Tenants",
    "Timings",
    "Unauthenticated",
    "Unavailable",
    "UnexpectedResponse",
    "ValidationFailed",
]
