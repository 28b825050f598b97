"""Messages on the dispatch wire. JSON only."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from runtimes.models import RunResult, RunSpec


class Job(BaseModel):
    """One execution for a node to run. The invocation row exists before a Job is sent."""

    model_config = ConfigDict(extra="forbid")

    invocation_id: str
    tenant_id: str
    kind: str = "run"  #: what the invocation record calls it: run | function
    runtime: str
    spec: RunSpec
    reply_to: str
    enqueued_at: float  #: epoch seconds

    @property
    def deadline_seconds(self) -> float:
        """The longest the job can legitimately run (compile plus run limits)."""
        limits = self.spec.limits
        return limits.compile_timeout_s + limits.run_timeout_s


class Completion(BaseModel):
    """A node's word that an invocation's final state is in the database.

    Small results ride along so the gateway need not read them back; a large one is
    left out (``result`` None) and the gateway reads the stored row.
    """

    invocation_id: str
    status: str
    attempt: int = 1
    error: str | None = None
    queue_ms: float | None = None
    result: RunResult | None = None
