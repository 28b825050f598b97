"""Bodies of the sandbox API (``/v1/sandboxes``): backend-neutral, containers today."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.json_schema import SkipJsonSchema

from wire.sandboxes import MAX_PAGE, FileEntry, NetworkPolicy

_ENV_KEY = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
_BACKEND = r"^[a-z][a-z0-9_-]{0,15}$"
#: a create's TTL when it asks for none (or the tenant's max_sandbox_lifetime_seconds,
#: if shorter: ``app.sandboxes.lifetime``)
DEFAULT_TTL_S = 300.0


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSandbox(_Body):
    backend: str = Field("crun", pattern=_BACKEND, description="crun (containers); microVMs later")
    image: str = Field(
        "python", min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/-]*$"
    )
    cpu: float = Field(1.0, gt=0, le=64, description="cores (a quota)")
    memory_mb: int = Field(512, ge=32, le=262_144)
    disk_mb: int = Field(1024, ge=16, le=1_048_576, description="size of the writable layer")
    ttl_s: float = Field(
        DEFAULT_TTL_S,
        gt=0,
        le=30 * 86400,
        description="lifetime; /timeout moves it. At most the tenant's "
        "max_sandbox_lifetime_seconds; when not given, 300 or that limit, the shorter",
    )
    idle_timeout_s: float | None = Field(None, gt=0, le=30 * 86400)
    env: dict[str, str] = Field(default_factory=dict, max_length=256)
    network: NetworkPolicy = Field(
        default_factory=NetworkPolicy,
        description='"none" (the default: no network), or {"allow": ["HOST[:PORT]", ...]}',
    )
    user: str = Field("user", min_length=1, max_length=64, description="commands run as")
    workdir: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        pattern=r"^/",
        description="where commands run unless an exec names a cwd (default: the user's "
        "home; a tenant's image: its WORKDIR)",
    )
    metadata: dict[str, str] = Field(default_factory=dict, max_length=64)
    snapshot_id: str | None = Field(
        None, max_length=32, description="start from this snapshot's files (its image, its node)"
    )

    @model_validator(mode="after")
    def _check_env(self) -> CreateSandbox:
        for key in self.env:
            if not re.fullmatch(_ENV_KEY, key):
                raise ValueError(f"invalid environment variable name {key!r}")
        return self


class Timings(BaseModel):
    queue_ms: float | None = None
    image_ms: float | None = None
    setup_ms: float | None = None
    start_ms: float | None = None


class SandboxOut(BaseModel):
    id: str
    backend: str
    image: str
    image_digest: str | None
    state: str
    node_id: str | None
    cpu: float
    memory_mb: int
    disk_mb: int
    network: NetworkPolicy
    created_at: datetime
    started_at: datetime | None
    expires_at: datetime | None
    ended_at: datetime | None
    reason: str | None
    metadata: dict[str, str]
    timings: Timings
    cpu_ms: float | None = None
    memory_bytes: int | None = None
    accelerator: str | None = Field(
        None, description="what runs a microVM's machine: kvm or tcg (null for a container)"
    )


class SandboxList(BaseModel):
    sandboxes: list[SandboxOut]
    next_cursor: str | None = Field(
        None, description="pass as cursor for the next page (none: this is the last)"
    )


#: ``metadata.KEY=VALUE`` query parameters: how a list filters on metadata
METADATA_PARAM = "metadata."
MetaKey = Annotated[str, StringConstraints(min_length=1, max_length=256)]
MetaValue = Annotated[str, StringConstraints(max_length=4096)]


class SandboxQuery(_Body):
    """Filters of ``GET /v1/sandboxes``, every one must match; and ``metadata.KEY=VALUE``
    parameters (any number, each key once): the sandbox's metadata has KEY set to VALUE."""

    state: Literal["creating", "running", "paused", "stopping", "stopped", "live"] | None = Field(
        "live", description="live: creating, running or paused"
    )
    backend: str | None = Field(None, pattern=_BACKEND)
    image: str | None = Field(None, min_length=1, max_length=256)
    limit: int = Field(100, ge=1, le=1000)
    cursor: str | None = Field(None, max_length=128, description="next_cursor of the previous page")
    metadata: SkipJsonSchema[dict[MetaKey, MetaValue]] = Field(default_factory=dict, max_length=16)

    @model_validator(mode="before")
    @classmethod
    def _metadata_params(cls, data: Any) -> Any:
        """``metadata.KEY`` parameters, as the ``metadata`` filter."""
        if not isinstance(data, dict):
            return data
        if "metadata" in data:
            raise ValueError(f"filter on metadata with {METADATA_PARAM}KEY=VALUE parameters")
        rest = {k: v for k, v in data.items() if not k.startswith(METADATA_PARAM)}
        wanted = {k[len(METADATA_PARAM) :]: v for k, v in data.items() if k not in rest}
        return rest | {"metadata": wanted}


class SnapshotQuery(_Body):
    limit: int = Field(100, ge=1, le=1000)


class ExecBody(_Body):
    cmd: list[str] | None = Field(None, min_length=1, max_length=4096)
    command: str | None = Field(None, max_length=1 << 20, description="run by /bin/sh -c")
    env: dict[str, str] = Field(default_factory=dict, max_length=256)
    cwd: str | None = Field(None, max_length=4096)
    user: str | None = Field(None, max_length=64)
    stdin: str | None = Field(None, max_length=16 << 20)
    timeout_s: float | None = Field(60.0, gt=0, le=86400)
    stream: bool = Field(False, description="answer NDJSON events as they come")
    binary: bool = Field(
        False,
        description="also give the output's exact bytes, base64 (stdout_b64 and stderr_b64; "
        "in a stream, data_b64 of each output event); without it they are given only where "
        "the output is not valid UTF-8",
    )

    @model_validator(mode="after")
    def _one_command(self) -> ExecBody:
        if (self.cmd is None) == (self.command is None):
            raise ValueError("give exactly one of cmd (argv) and command (a shell line)")
        return self

    def argv(self) -> list[str]:
        return self.cmd if self.cmd is not None else ["/bin/sh", "-c", self.command or ""]


class ExecOut(BaseModel):
    """A whole command's outcome; its output as text, and as bytes where text would not
    carry them exactly (``app.sandboxes.output``)."""

    pid: int | None = None
    exit_code: int | None = Field(description="None when a signal killed it")
    signal: int | None = None
    timed_out: bool = False
    duration_ms: float
    stdout: str = Field("", description="UTF-8 decoded; an invalid byte is U+FFFD")
    stderr: str = Field("", description="UTF-8 decoded; an invalid byte is U+FFFD")
    stdout_b64: str | None = Field(
        None, description="the exact bytes, base64, when they are not valid UTF-8 or asked"
    )
    stderr_b64: str | None = Field(
        None, description="the exact bytes, base64, when they are not valid UTF-8 or asked"
    )
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    error: str | None = Field(None, description="why the command could not start")


class ExecOutputEvent(BaseModel):
    """An output event of a streamed exec: text of whole characters, and its exact bytes
    when they are not valid UTF-8 or asked."""

    kind: Literal["output"] = "output"
    stream: Literal["stdout", "stderr"]
    data: str
    data_b64: str | None = None


class SnapshotOut(BaseModel):
    id: str
    sandbox_id: str
    backend: str
    image: str
    image_digest: str
    node_id: str
    size_bytes: int
    created_at: datetime


class SnapshotList(BaseModel):
    snapshots: list[SnapshotOut]


class ForkBody(_Body):
    count: int = Field(1, ge=1, le=64, description="new sandboxes, each from the same snapshot")
    ttl_s: float | None = Field(None, gt=0, le=30 * 86400)
    metadata: dict[str, str] = Field(default_factory=dict, max_length=64)


class ForkOut(BaseModel):
    snapshot: SnapshotOut
    sandboxes: list[SandboxOut]


class TimeoutBody(_Body):
    ttl_s: float = Field(gt=0, le=30 * 86400, description="the sandbox ends this long from now")


_ACTS_AS = "who the call acts as (a name, uid or uid:gid); default: the sandbox's user"


class PathQuery(_Body):
    path: str = Field(min_length=1, max_length=4096)
    user: str | None = Field(None, max_length=64, description=_ACTS_AS)
    mode: str | None = Field(None, pattern=r"^[0-7]{3,4}$")
    depth: int = Field(1, ge=1, le=16)


class ListQuery(_Body):
    path: str = Field(min_length=1, max_length=4096)
    user: str | None = Field(None, max_length=64, description=_ACTS_AS)
    depth: int = Field(1, ge=1, le=16)
    limit: int = Field(MAX_PAGE, ge=1, le=MAX_PAGE, description="entries in this page, at most")
    cursor: str | None = Field(
        None,
        max_length=5600,
        pattern=r"^[A-Za-z0-9_-]*$",
        description="next_cursor of the previous page",
    )


class PathBody(_Body):
    path: str = Field(min_length=1, max_length=4096)
    user: str | None = Field(None, max_length=64, description=_ACTS_AS)


class MoveBody(_Body):
    source: str = Field(min_length=1, max_length=4096)
    destination: str = Field(min_length=1, max_length=4096)
    user: str | None = Field(None, max_length=64, description=_ACTS_AS)


class EntryList(BaseModel):
    entries: list[FileEntry]
    next_cursor: str | None = Field(
        None, description="pass as cursor for the next page (none: this is the last)"
    )
