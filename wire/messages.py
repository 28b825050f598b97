"""Messages between the planes. JSON only; unknown fields are refused.

gateway -> node      ``Job`` on a job stream, with its ``Marker`` beside it in Redis.
node -> gateway      ``Started`` and ``Finished`` on the dispatching gateway's results
                     stream; the gateway's recorder stores them. ``Stored`` tells a
                     gateway that a row it waits for became final elsewhere.
node -> anyone       ``NodeReport`` (liveness and capacity) and ``PoolUsage`` (idle
                     capacity held warm).

A **claim token** (``Job.claim``) fences every hand-out of an execution: the control
plane issues a new one, and counts it in ``attempts``, each time it dispatches the
execution; a node runs a Job only after claiming its token (so one token runs at most
once), and the recorder stores only the result of the row's current token.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from wire import keys
from wire.execution import RunResult, RunSpec


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Job(_Message):
    """One execution for a node to run. Its invocation row exists before it is sent."""

    invocation_id: str
    tenant_id: str
    kind: str = "run"  #: what the invocation record calls it: run | function
    runtime: str
    spec: RunSpec
    claim: str  #: fencing token of this hand-out
    attempt: int = Field(1, ge=1)  #: hand-outs so far, this one included
    reply_to: str  #: the gateway whose results stream hears about this job
    enqueued_at: float  #: epoch seconds

    @property
    def deadline_seconds(self) -> float:
        """The longest the job can legitimately run (compile plus run, by the clock)."""
        return self.spec.limits.wall_seconds


class Marker(_Message):
    """The dispatch marker of one execution in flight (``wire.keys.inflight``)."""

    claim: str
    attempt: int
    stream: str  #: the job stream it was put on
    placed_on: str | None = None  #: node id, or None on a runtime's overflow stream
    claimed_by: str | None = None  #: node id of the node running it
    incarnation: str | None = None  #: that node process's incarnation
    entry: str | None = None  #: the delivery it claimed (``stream/entry id``)
    claimed_at: float | None = None  #: epoch seconds
    deadline_s: float  #: the Job's own time limits
    hold_s: float  #: once claimed, the marker lives ``deadline_s + hold_s``

    @classmethod
    def placing(cls, job: Job, *, node_id: str | None, hold_s: float) -> Marker:
        """The marker of ``job`` put on ``node_id``'s stream (None: its runtime's overflow)."""
        stream = keys.jobs_for_node(node_id) if node_id else keys.jobs(job.runtime, job.tenant_id)
        return cls(
            claim=job.claim,
            attempt=job.attempt,
            stream=stream,
            placed_on=node_id,
            deadline_s=job.deadline_seconds,
            hold_s=hold_s,
        )


class DeliveryRef(_Message):
    """Where a Job was read from, so that the recorder can acknowledge it."""

    stream: str = ""
    entry_id: str = ""


class Started(_Message):
    type: Literal["started"] = "started"
    invocation_id: str
    claim: str
    node_id: str
    started_at: float  #: epoch seconds


class Finished(_Message):
    type: Literal["finished"] = "finished"
    invocation_id: str
    claim: str
    attempt: int  #: the Job's attempt (the row's ``attempts`` while its claim is current)
    node_id: str
    started_at: float  #: epoch seconds
    finished_at: float  #: epoch seconds
    queue_ms: float
    result: RunResult
    delivery: DeliveryRef = Field(default_factory=DeliveryRef)


class Stored(_Message):
    """The row of an invocation became final outside this gateway (the reconciler)."""

    type: Literal["stored"] = "stored"
    invocation_id: str


ResultEvent = Annotated[Started | Finished | Stored, Field(discriminator="type")]
RESULT_EVENT: TypeAdapter[Started | Finished | Stored] = TypeAdapter(ResultEvent)


class PoolUsage(_Message):
    """Idle capacity one warm pool held over a period: warm, started, and unused."""

    type: Literal["pool_usage"] = "pool_usage"
    node_id: str
    pool: str  #: ``pool_key`` of the pool
    period_start: float  #: epoch seconds
    period_end: float
    idle_instance_seconds: float
    idle_memory_mb_seconds: float
    starts: int = 0  #: workers started in the period
    cold_starts: int = 0  #: of which a caller waited for
    start_cpu_ms: float = 0.0  #: CPU time those starts used (the platform's)


NodeEvent = Annotated[PoolUsage, Field(discriminator="type")]
NODE_EVENT: TypeAdapter[PoolUsage] = TypeAdapter(NodeEvent)


class NodeReport(_Message):
    """What a node announces with each heartbeat: the placement catalogue's entry."""

    node_id: str
    incarnation: str  #: random per process start: a restarted node is a new incarnation
    address: str | None = None  #: the node's own HTTP listener (/healthz, /metrics)
    runtimes: dict[str, list[str]]  #: runtime -> languages
    slots: int  #: executions at once
    slots_free: int
    memory_mb: int  #: memory the node may give to executions
    memory_free_mb: int
    warm: dict[str, int] = Field(default_factory=dict)  #: pool_key -> idle warm workers
    #: backend -> its workers by state: ``{"warm": .., "busy": .., "starting": ..}``
    pools: dict[str, dict[str, int]] = Field(default_factory=dict)
    sandboxes: int = 0  #: live sandboxes it holds
    sandbox_backends: list[str] = Field(default_factory=list)  #: e.g. ["crun"]
    #: what runs each machine-backed backend's sandboxes, e.g. {"microvm": "tcg"}
    sandbox_accelerators: dict[str, str] = Field(default_factory=dict)
    sandbox_room: int = 0  #: sandboxes it can still take
    #: memory its sandboxes may hold together (their memory limits summed; warm ones not
    #: counted: ``node.sandboxes.manager``); None: not reported
    sandbox_memory_mb: int | None = None
    sandbox_memory_free_mb: int = 0  #: of that, what no live sandbox (or create) holds
    sandbox_cpu: float | None = None  #: CPU (cores) its sandboxes may hold together
    sandbox_cpu_free: float = 0.0
    started_at: float
    reported_at: float

    def runtime_for(self, language: str) -> str | None:
        for runtime, languages in sorted(self.runtimes.items()):
            if language in languages:
                return runtime
        return None


def pool_key(runtime: str, language: str, tenant_id: str | None = None) -> str:
    """How a warm pool is named in reports: ``runtime/language`` or ``runtime/language/tenant``
    (a backend that binds warm workers to a tenant, like nsjail, reports both: spare
    workers under the first, bound ones under the second)."""
    key = f"{runtime}/{language}"
    return f"{key}/{tenant_id}" if tenant_id else key
