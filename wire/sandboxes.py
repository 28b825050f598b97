"""Sandbox contracts: what the gateway asks of the node that holds a sandbox.

A stateful sandbox lives on one node. The gateway records it, places it, and sends every
operation on it to that node's sandbox API (``node.sandboxes.http``) with these
bodies; the node's backend (crun containers today, microVMs next) does the work. JSON
only; unknown fields are refused. Sizes in MiB, times in seconds unless named ``_ms``.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import AsyncIterable
from dataclasses import dataclass
from enum import StrEnum
from ipaddress import IPv4Network
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NetworkPolicy(_Message):
    """What a sandbox may reach. No entries (``"none"``, the default): its own loopback
    only. Otherwise outbound connections to these destinations only, each ``HOST[:PORT]``
    where HOST is an IPv4 address, an IPv4 network (``10.1.0.0/16``; ``0.0.0.0/0`` is the
    public internet) or a host name the node resolves when it attaches the sandbox, and
    PORT (TCP and UDP) is one port or all of them when left out. Nothing reaches the node
    itself, other sandboxes, loopback, link-local (cloud metadata) or multicast addresses,
    nor the node operator's denied networks, whatever the list says
    (``node.sandboxes.network``)."""

    allow: list[Annotated[str, Field(min_length=1, max_length=260)]] = Field(
        default_factory=list, max_length=64
    )

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: object) -> object:
        if value == "none":
            return {"allow": []}
        return value

    @field_validator("allow")
    @classmethod
    def _check(cls, allow: list[str]) -> list[str]:
        for entry in allow:
            parse_destination(entry)
        return allow

    @property
    def isolated(self) -> bool:
        return not self.allow


@dataclass(frozen=True, slots=True)
class Destination:
    """One allow-list entry: a network (``host`` set when it was a name) and a port."""

    network: IPv4Network | None  #: None: a host name, resolved on the node
    host: str | None
    port: int | None  #: None: every port


_HOST_NAME = re.compile(
    r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)


_NUMERIC = frozenset("0123456789./")


def parse_destination(entry: str) -> Destination:
    """``HOST[:PORT]`` of an allow list; ValueError says what is wrong."""
    host, sep, port_text = entry.rpartition(":")
    if not sep:
        host, port_text = entry, ""
    port: int | None = None
    if sep:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65_535:
            raise ValueError(f"network entry {entry!r}: the port must be 1-65535")
        port = int(port_text)
    if not host or host.startswith("["):
        raise ValueError(f"network entry {entry!r}: expected HOST[:PORT] (IPv4 only)")
    if set(host) <= _NUMERIC:
        try:
            network = IPv4Network(host, strict=False)
        except ValueError as exc:
            raise ValueError(f"network entry {entry!r}: {exc}") from None
        return Destination(network=network, host=None, port=port)
    if not _HOST_NAME.match(host):
        raise ValueError(f"network entry {entry!r}: not an IPv4 address, network or host name")
    return Destination(network=None, host=host.rstrip(".").lower(), port=port)


class SandboxState(StrEnum):
    CREATING = "creating"
    RUNNING = "running"
    PAUSED = "paused"
    #: the gateway's record only: its destroy is acknowledged, its teardown on the way
    STOPPING = "stopping"
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
    network: NetworkPolicy = Field(default_factory=NetworkPolicy)
    user: str = Field("user", description="who commands run as unless an exec says otherwise")
    workdir: str | None = Field(
        None, description="where commands run unless an exec says otherwise (None: the user's home)"
    )
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
    #: what runs a microVM sandbox's machine (``kvm`` or ``tcg``); None for a container
    accelerator: str | None = None


class PtySize(_Message):
    """A terminal's size in character cells."""

    cols: int = Field(ge=1, le=1000)
    rows: int = Field(ge=1, le=1000)


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
    pty: PtySize | None = Field(
        None,
        description="run on a terminal of this size, allocated inside the sandbox: its "
        "stdin, stdout and stderr; its output is one stream (``pty``), its input stays "
        "open; TERM=xterm-256color unless given",
    )


def _from_base64(value: object, info: ValidationInfo) -> object:
    """A string in JSON is the bytes' base64 (what ``Base64Data`` serializes); in Python,
    bytes are taken as they are (and a string as its UTF-8)."""
    if info.mode == "json" and isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"not base64: {exc}") from None
    return value


#: bytes carried exactly: base64 in JSON, raw in Python (``pydantic.Base64Bytes`` would
#: decode raw bytes given in Python as base64 too)
Base64Data = Annotated[
    bytes,
    BeforeValidator(_from_base64),
    PlainSerializer(
        lambda data: base64.b64encode(data).decode(), return_type=str, when_used="json"
    ),
]


class ExecOutput(_Message):
    """A chunk of a command's output as its pipe gave it: bytes, never decoded on the
    node (a character split between two reads, or output that is not text, reaches the
    caller whole; the gateway decodes for the surfaces that answer text)."""

    kind: Literal["output"] = "output"
    stream: Literal["stdout", "stderr", "pty"]  #: ``pty``: a terminal's, its only stream
    data: Base64Data


class ExecStarted(_Message):
    kind: Literal["started"] = "started"
    pid: int  #: the command's pid inside the sandbox


class ExecExit(_Message):
    kind: Literal["exit"] = "exit"
    exit_code: int | None  #: None when killed by a signal
    signal: int | None = None
    timed_out: bool = False
    duration_ms: float
    stdout_truncated: bool = False  #: a terminal's output (``pty``) counts as stdout
    stderr_truncated: bool = False
    error: str | None = None  #: the command could not be started


ExecEvent = Annotated[ExecStarted | ExecOutput | ExecExit, Field(discriminator="kind")]
EXEC_EVENT = TypeAdapter(ExecEvent)


class ExecResult(_Message):
    """A whole command's outcome (the streamed events, gathered): its output as bytes."""

    pid: int | None = None
    exit_code: int | None
    signal: int | None = None
    timed_out: bool = False
    duration_ms: float
    stdout: Base64Data = b""
    stderr: Base64Data = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    error: str | None = None


async def collect(events: AsyncIterable[ExecEvent]) -> ExecResult:
    """A command's whole outcome from its events."""
    pid: int | None = None
    out: dict[str, list[bytes]] = {"stdout": [], "stderr": [], "pty": []}
    result = ExecResult(exit_code=None, duration_ms=0.0, error="the command's end was not seen")
    async for event in events:
        if isinstance(event, ExecStarted):
            pid = event.pid
        elif isinstance(event, ExecOutput):
            out[event.stream].append(event.data)
        else:
            result = ExecResult(**event.model_dump(exclude={"kind"}))
    result.pid = pid
    result.stdout = b"".join(out["stdout"] + out["pty"])  # a terminal's output is its stdout
    result.stderr = b"".join(out["stderr"])
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
    owner: str  #: the owner's uid in the sandbox, as text ("1000"), on every backend
    group: str  #: the group's gid in the sandbox, as text
    modified_at: float
    symlink_target: str | None = None


#: most entries in one page of a directory listing
MAX_PAGE = 1000
#: the largest file read or written in one request, by the node (the gateway's
#: ``max_file_bytes`` is at most this); a sandbox's disk bounds an upload too
MAX_FILE_BYTES = 4 << 30


class EntryPage(_Message):
    """One page of a directory listing; ``next_cursor`` (opaque) asks for the next one,
    None: this is the last."""

    entries: list[FileEntry]
    next_cursor: str | None = None


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


class FsEventType(StrEnum):
    CREATE = "create"  #: made, or moved in
    WRITE = "write"
    REMOVE = "remove"
    RENAME = "rename"  #: moved away (its new name, if in the directory, is a create)
    CHMOD = "chmod"  #: mode, owner or times


class FsEvent(_Message):
    """A change in a watched directory."""

    name: str  #: the entry's name, relative to the watched directory
    type: FsEventType


class WatchEvents(_Message):
    events: list[FsEvent]
    dropped: int = 0  #: events lost because the watcher was not read fast enough
    ended: bool = False  #: the directory is gone (removed, or its sandbox ended)
