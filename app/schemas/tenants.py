"""Admin API bodies: tenants, quotas and API keys."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from app.schemas.common import Strict

Name = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]


class QuotaPatch(Strict):
    """Any subset of a tenant's quotas."""

    max_concurrent_executions: int | None = Field(None, ge=1, le=100_000)
    max_concurrent_sandboxes: int | None = Field(None, ge=0, le=100_000)
    executions_per_second: float | None = Field(None, gt=0, le=1_000_000)
    burst: int | None = Field(None, ge=1, le=10_000_000)
    cpu_seconds_per_day: float | None = Field(None, gt=0)
    max_memory_mb: int | None = Field(None, ge=16, le=1_048_576)
    max_wall_seconds: float | None = Field(None, gt=0, le=86_400)
    max_sandbox_lifetime_seconds: int | None = Field(None, ge=1, le=30 * 86_400)


class QuotaOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    max_concurrent_executions: int
    max_concurrent_sandboxes: int
    executions_per_second: float
    burst: int
    cpu_seconds_per_day: float
    max_memory_mb: int
    max_wall_seconds: float
    max_sandbox_lifetime_seconds: int


class TenantCreate(Strict):
    name: Name = Field(examples=["rl-team-a"])
    quota: QuotaPatch = Field(default_factory=QuotaPatch)
    key_name: str = Field("default", max_length=128)


class TenantPatch(Strict):
    name: Name | None = None
    disabled: bool | None = None
    quota: QuotaPatch | None = None


class TenantOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    disabled: bool
    created_at: datetime
    quota: QuotaOut


class TenantList(BaseModel):
    tenants: list[TenantOut]
    next_after: str | None = None


class KeyCreate(Strict):
    name: str = Field("", max_length=128)


class KeyOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    tenant_id: str
    name: str
    created_at: datetime
    revoked_at: datetime | None = None


class KeyList(BaseModel):
    keys: list[KeyOut]


class NewKeyOut(KeyOut):
    api_key: str = Field(description="The whole key. Shown once; store it now.")


class TenantCreated(BaseModel):
    tenant: TenantOut
    key: NewKeyOut
