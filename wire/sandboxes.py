"""Sandbox contracts: what the gateway asks of the node that holds a sandbox.

A stateful sandbox lives on one node. The gateway records it, places it, and sends every
operation on it to that node's sandbox API (``runtimes.sandboxes.http``) with these
bodies; the node's backend (crun containers today, microVMs next) does the work. JSON
only; unknown fields are refused. Sizes in MiB, times in seconds unless named ``_ms``.
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NetworkPolicy(StrEnum):
    NONE = "none"  #: a network namespace with only its own loopback


class SandboxState(StrEnum):
    CREATING = "creating"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"  #: ended: destroyed, expired, idle, lost or failed


class SandboxSpec(_Message):
    """Everything a node needs to create a sandbox (the gateway resolved the defaults)."""

    sandbox_id: str
    tenant_id: str
    backend: str = "crun"
    image: str = Field(description="an image name or digest the node's image store knows")
    cpu: float = Field(1.0, gt=0, le=64, description="cores (a CPU quota, not a pin)")
    memory_mb: int = Field(512, ge=16, le=262_144)
    disk_mb: int = Field(1024, ge=16, le=1_048_576, description="size of the writable layer")
    pids: int = Field(512, ge=16, le=65_536, description="processes and threads")
    ttl_s: float = Field(300, gt=0, description="lifetime from creation; extended by /timeout")
    idle_timeout_s: float | None = Field(
        None, gt=0, description="reaped after this long without an operation"
    )
    env: dict[str, str] = Field(default_factory=dict)
    network: NetworkPolicy = NetworkPolicy.NONE
    user: str = Field("user", description="who commands run as unless an exec says otherwise")
    snapshot_id: str | None = Field(
        None, description="start from this snapshot's files (on this node) instead of the image's"
    )


class Phases(_Message):
    """How long each phase of a sandbox's creation took (ms)."""

    image_ms: float = 0.0  #: finding (or fetching) the image
    setup_ms: float = 0.0  #: writable layer, bundle, cgroups
    start_ms: float = 0.0  #: the runtime's create and start


class SandboxStatus(_Message):
    """What a node knows of one of its sandboxes."""

    sandbox_id: str
    tenant_id: str
    backend: str
    image_digest: str
    state: SandboxState
    created_at: float  #: epoch seconds
    expires_at: float  #: epoch seconds; the node destroys it then
    last_active_at: float
    memory_bytes: int | None = None  #: in use now (the cgroup's reading)
    cpu_ms: float | None = None  #: CPU time used so far
    disk_bytes: int | None = None  #: the writable layer's use
    reason: str | None = None  #: why it stopped
    phases: Phases = Field(default_factory=Phases)


class ExecRequest(_Message):
    cmd: list[str] = Field(min_length=1, max_length=4096)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    user: str | None = None  #: "root", "user", a uid or "uid:gid"; default: the sandbox's
    stdin: str | None = Field(None, description="written to the command, then closed")
    stdin_open: bool = Field(
        False, description="keep stdin open for later input (else it is closed at start)"
    )
    timeout_s: float | None = Field(
        60.0, gt=0, description="the command's whole session is killed after this; None: never"
    )
    max_output_bytes: int = Field(
        4 << 20, ge=0, le=64 << 20, description="kept per stream in the whole answer"
    )


class ExecOutput(_Message):
    kind: Literal["output"] = "output"
    stream: Literal["stdout", "stderr"]
    data: str


class ExecStarted(_Message):
    kind: Literal["started"] = "started"
    pid: int  #: the command's pid inside the sandbox


class ExecExit(_Message):
    kind: Literal["exit"] = "exit"
    exit_code: int | None  #: None when killed by a signal
    signal: int | None = None
    timed_out: bool = False
    duration_ms: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    error: str | None = None  #: the command could not be started


ExecEvent = Annotated[ExecStarted | ExecOutput | ExecExit, Field(discriminator="kind")]
EXEC_EVENT = TypeAdapter(ExecEvent)


class ExecResult(_Message):
    """A whole command's outcome (the streamed events, gathered)."""

    pid: int | None = None
    exit_code: int | None
    signal: int | None = None
    timed_out: bool = False
    duration_ms: float
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    error: str | None = None


async def collect(events: AsyncIterable[ExecEvent]) -> ExecResult:
    """A command's whole outcome from its events."""
    pid: int | None = None
    out: dict[str, list[str]] = {"stdout": [], "stderr": []}
    result = ExecResult(exit_code=None, duration_ms=0.0, error="the command's end was not seen")
    async for event in events:
        if isinstance(event, ExecStarted):
            pid = event.pid
        elif isinstance(event, ExecOutput):
            out[event.stream].append(event.data)
        else:
            result = ExecResult(**event.model_dump(exclude={"kind"}))
    result.pid = pid
    result.stdout, result.stderr = "".join(out["stdout"]), "".join(out["stderr"])
    return result


class FileType(StrEnum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    OTHER = "other"


class FileEntry(_Message):
    name: str
    path: str  #: absolute, inside the sandbox
    type: FileType
    size: int
    mode: int  #: permission bits
    owner: str
    group: str
    modified_at: float
    symlink_target: str | None = None


class SnapshotInfo(_Message):
    """A copy of a sandbox's files on the node that made it."""

    snapshot_id: str
    sandbox_id: str
    tenant_id: str
    backend: str
    image_digest: str
    parent_snapshot_id: str | None = None  #: the snapshot the sandbox itself started from
    size_bytes: int
    created_at: float


class SandboxInventory(_Message):
    """Every sandbox a node holds (the gateway's reconciler compares it with the records)."""

    node_id: str
    sandboxes: list[SandboxStatus]
