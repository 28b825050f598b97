"""Bodies of the usage endpoint."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal, Self

from pydantic import AwareDatetime, BaseModel, Field, field_validator, model_validator

from app.schemas.common import Strict
from app.usage.report import GROUPS, Group

#: The longest range one report covers.
MAX_RANGE = timedelta(days=400)


class UsageQuery(Strict):
    start: AwareDatetime | None = Field(
        None,
        description="from this time (with a timezone; rounded down to the hour); "
        "default: 24 hours before end",
    )
    end: AwareDatetime | None = Field(
        None, description="until this time (rounded up to the hour); default: now"
    )
    group_by: str = Field(
        "tenant,day",
        max_length=128,
        description="comma-separated: " + ", ".join(GROUPS),
    )
    tenant: str | None = Field(
        None, max_length=32, description="the operator only: one tenant's id"
    )
    format: Literal["json", "csv"] = "json"

    @field_validator("group_by")
    @classmethod
    def _known_groups(cls, value: str) -> str:
        groups = [g.strip() for g in value.split(",") if g.strip()]
        unknown = [g for g in groups if g not in GROUPS]
        if unknown:
            raise ValueError(f"unknown grouping {', '.join(unknown)}; one of {', '.join(GROUPS)}")
        if not groups:
            raise ValueError("at least one grouping")
        if len(set(groups)) != len(groups):
            raise ValueError("a grouping is listed twice")
        return ",".join(groups)

    @model_validator(mode="after")
    def _a_range(self) -> Self:
        if self.start is not None and self.end is not None:
            if self.end <= self.start:
                raise ValueError("end must be after start")
            if self.end - self.start > MAX_RANGE:
                raise ValueError(f"a report covers at most {MAX_RANGE.days} days")
        return self

    @property
    def groups(self) -> list[Group]:
        return [g for g in self.group_by.split(",") if g]  # type: ignore[misc]


class UsageRow(BaseModel):
    group: dict[str, str] = Field(description="the value of each grouping of the row")
    events: int = Field(description="executions, sandbox intervals and idle periods counted")
    failures: int
    retries: int = Field(description="executions handed out again after a lost node")
    queue_s: float
    setup_s: float
    exec_s: float
    teardown_s: float
    cpu_s: float
    memory_gb_s: float
    instance_hours: float = Field(
        description="instances held: sandboxes alive, a call's jail or wasm instance from its "
        "setup to its teardown, warm workers held idle"
    )
    stored_gb_hours: float = Field(
        description="GB kept stored (large outputs, function artifacts, snapshots) times hours"
    )
    bytes_in: int
    bytes_out: int
    queue_share: float = Field(description="share of the row's time spent waiting")
    setup_share: float
    exec_share: float
    teardown_share: float
    cost_cpu: float
    cost_memory: float
    cost_instances: float
    cost_transfer: float
    cost_storage: float
    cost: float


class UsageReport(BaseModel):
    start: datetime = Field(description="the range, in whole UTC hours")
    end: datetime
    group_by: list[str]
    currency: str
    rows: list[UsageRow]
    total: UsageRow
