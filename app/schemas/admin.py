"""Bodies of the operator's views of the gateway itself (``/v1/admin/...``)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from app.schemas.common import Strict


class DeadLetterQuery(Strict):
    limit: int = Field(50, ge=1, le=500)
    before: datetime | None = Field(None, description="only letters made before this time")


class DeadLetterOut(BaseModel):
    """A node report the recorder could not store (``app.db.dead_letters``)."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    created_at: datetime
    gateway_id: str = Field(description="the gateway whose recorder gave up")
    kind: str = Field(description="finished | started | stored | pool_usage")
    invocation_id: str | None = Field(
        None, description="the invocation it reported on, ended errored (result_not_stored)"
    )
    node_id: str | None = None
    tries: int
    error: str = Field(description="the last failure of its write")
    event: str = Field(description="the report as it arrived (JSON; its first 256 KiB)")


class DeadLetterList(BaseModel):
    dead_letters: list[DeadLetterOut]


class LeaderJobOut(BaseModel):
    """One of the leader's jobs, as this gateway ran it (``app.leader.JobStatus``)."""

    model_config = ConfigDict(from_attributes=True)

    name: str
    what: str
    period_s: float
    runs: int = Field(description="runs while this gateway led")
    failures: int
    running: bool
    last_started_at: datetime | None = None
    last_duration_s: float | None = None
    last_error: str | None = Field(None, description="of the last run (null: it succeeded)")


class LeaderOut(BaseModel):
    gateway_id: str = Field(description="the gateway that answered")
    leading: bool = Field(description="whether it leads now (one gateway of a cluster does)")
    jobs: list[LeaderJobOut]
