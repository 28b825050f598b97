"""What the API answers, as small frozen dataclasses parsed from its JSON.

Fields the server adds later are ignored, so an older SDK keeps working against a newer
server.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


def _opt_float(value: Any) -> float | None:
    return float(value) if value is not None else None


def exact_bytes(encoded: Any, text: str) -> bytes:
    """The bytes an answer's base64 form gives, else its text's UTF-8 (exact then)."""
    return base64.b64decode(encoded) if isinstance(encoded, str) else text.encode()


def _exact(encoded: Any, text: str, given: bytes | None) -> bytes:
    return given if given is not None and encoded is None else exact_bytes(encoded, text)


@dataclass(frozen=True)
class Timings:
    """How long each phase of the sandbox's creation took (ms)."""

    queue_ms: float | None = None
    image_ms: float | None = None
    setup_ms: float | None = None
    start_ms: float | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Timings:
        data = data or {}
        return cls(
            **{k: _opt_float(data.get(k)) for k in ("queue_ms", "image_ms", "setup_ms", "start_ms")}
        )


@dataclass(frozen=True)
class SandboxInfo:
    """The record of a sandbox (``GET /v1/sandboxes/{id}``)."""

    id: str
    state: str  #: creating, running, paused, stopping (destroyed, being torn down), stopped
    backend: str
    image: str
    image_digest: str | None
    node_id: str | None
    cpu: float
    memory_mb: int
    disk_mb: int
    created_at: datetime | None
    started_at: datetime | None
    expires_at: datetime | None
    ended_at: datetime | None
    reason: str | None  #: why it stopped
    metadata: dict[str, str] = field(default_factory=dict)
    timings: Timings = field(default_factory=Timings)
    cpu_ms: float | None = None
    memory_bytes: int | None = None
    #: the destinations it may reach (``HOST[:PORT]``); empty: no network
    network: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SandboxInfo:
        return cls(
            id=data["id"],
            state=data["state"],
            backend=data.get("backend", ""),
            image=data.get("image", ""),
            image_digest=data.get("image_digest"),
            node_id=data.get("node_id"),
            cpu=float(data.get("cpu", 0.0)),
            memory_mb=int(data.get("memory_mb", 0)),
            disk_mb=int(data.get("disk_mb", 0)),
            created_at=_time(data.get("created_at")),
            started_at=_time(data.get("started_at")),
            expires_at=_time(data.get("expires_at")),
            ended_at=_time(data.get("ended_at")),
            reason=data.get("reason"),
            metadata=dict(data.get("metadata") or {}),
            timings=Timings.from_json(data.get("timings")),
            cpu_ms=_opt_float(data.get("cpu_ms")),
            memory_bytes=data.get("memory_bytes"),
            network=list((data.get("network") or {}).get("allow") or []),
        )


@dataclass(frozen=True)
class ExecResult:
    """A command's outcome. ``exit_code`` is None when a signal killed it (``signal``),
    e.g. at its timeout (``timed_out``); ``error`` says why it could not start.
    ``stdout``/``stderr`` are the output as text (an invalid UTF-8 byte shown as U+FFFD);
    ``stdout_bytes``/``stderr_bytes`` are the exact bytes the command wrote."""

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    signal: int | None = None
    timed_out: bool = False
    duration_ms: float = 0.0
    pid: int | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    error: str | None = None
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""

    @property
    def ok(self) -> bool:
        """It ran and exited 0."""
        return self.exit_code == 0 and self.error is None

    @classmethod
    def from_json(
        cls,
        data: dict[str, Any],
        *,
        stdout: str = "",
        stderr: str = "",
        stdout_bytes: bytes | None = None,
        stderr_bytes: bytes | None = None,
    ) -> ExecResult:
        """From a whole exec answer, or from a stream's ``exit`` event and its output.
        The server gives a stream's bytes (``*_b64``) where its text does not carry them
        exactly; else the text's UTF-8 is the bytes."""
        stdout, stderr = data.get("stdout", stdout), data.get("stderr", stderr)
        return cls(
            exit_code=data.get("exit_code"),
            stdout=stdout,
            stderr=stderr,
            stdout_bytes=_exact(data.get("stdout_b64"), stdout, stdout_bytes),
            stderr_bytes=_exact(data.get("stderr_b64"), stderr, stderr_bytes),
            signal=data.get("signal"),
            timed_out=bool(data.get("timed_out", False)),
            duration_ms=float(data.get("duration_ms", 0.0)),
            pid=data.get("pid"),
            stdout_truncated=bool(data.get("stdout_truncated", False)),
            stderr_truncated=bool(data.get("stderr_truncated", False)),
            error=data.get("error"),
        )


@dataclass(frozen=True)
class FileEntry:
    """A file, directory or link in a sandbox."""

    name: str
    path: str  #: absolute, inside the sandbox
    type: str  #: file, dir, symlink or other
    size: int
    mode: int  #: permission bits
    owner: str
    group: str
    modified_at: float  #: epoch seconds
    symlink_target: str | None = None

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileEntry:
        return cls(
            name=data["name"],
            path=data["path"],
            type=data["type"],
            size=int(data["size"]),
            mode=int(data["mode"]),
            owner=str(data["owner"]),
            group=str(data["group"]),
            modified_at=float(data["modified_at"]),
            symlink_target=data.get("symlink_target"),
        )
