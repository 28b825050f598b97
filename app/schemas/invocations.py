"""Bodies of the invocation history endpoints."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, Field

from app.schemas.common import Strict
from app.schemas.run import RunResponse


class InvocationQuery(Strict):
    limit: int = Field(50, ge=1, le=500)
    status: Literal["queued", "running", "succeeded", "failed", "errored"] | None = None
    kind: Literal["run", "function"] | None = None
    language: str | None = Field(None, max_length=32)
    before: AwareDatetime | None = Field(
        None, description="only invocations created before this time (with a timezone)"
    )
    cursor: str | None = Field(None, max_length=128, description="next_cursor of the previous page")


class InvocationOut(RunResponse):
    kind: str
    language: str | None = None
    runtime: str | None = None
    node_id: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


class InvocationList(BaseModel):
    invocations: list[InvocationOut]
    next_cursor: str | None = Field(None, description="pass as cursor for the next page")
