"""Background processes in a sandbox: what the gateway asks of a node beyond ``exec``.

An ``exec`` lives as long as its request. A process started through the node's process
table (``node.sandboxes.processes``) outlives the request that started it: it is
listed by pid, its output can be followed again, and it can be signalled or fed stdin
until it exits, its own timeout kills it, or the sandbox ends. The E2B compatibility
layer's process service is built on it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from wire.sandboxes import ExecRequest, PtySize


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StartProcess(_Message):
    request: ExecRequest
    tag: str | None = Field(None, max_length=256, description="a name to find it by")


class ProcessInfo(_Message):
    pid: int
    tag: str | None = None
    cmd: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    user: str | None = None
    started_at: float  #: epoch seconds


class ProcessSignal(_Message):
    signal: int = Field(ge=1, le=64)


class ProcessResize(_Message):
    """A new size for a process's terminal (one started with ``ExecRequest.pty``)."""

    size: PtySize
