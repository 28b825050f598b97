"""Admin API bodies: tenants, quotas and API keys."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from app.quotas.spec import QuotaLimits, QuotaPatch
from app.schemas.common import Strict

Name = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]

#: A key's label: free text, but no control characters (a database text column cannot hold
#: NUL, and a label is printed in terminals and logs).
Label = Annotated[str, StringConstraints(max_length=128, pattern=r"^[^\x00-\x1f\x7f]*$")]


class TenantCreate(Strict):
    name: Name = Field(examples=["rl-team-a"])
    quota: QuotaPatch = Field(default_factory=QuotaPatch)  # type: ignore[valid-type]
    key_name: Label = "default"


class TenantPatch(Strict):
    name: Name | None = None
    disabled: bool | None = None
    quota: QuotaPatch | None = None  # type: ignore[valid-type]


class TenantOut(BaseModel):
    id: str
    name: str
    disabled: bool
    created_at: datetime
    deleted_at: datetime | None = Field(
        default=None, description="deleted by the operator: disabled for good, keys revoked"
    )
    purged_at: datetime | None = Field(
        default=None, description="its content removed too, nothing being left to remove"
    )
    quota: QuotaLimits
    throttled: dict[str, int] = Field(
        default_factory=dict,
        description="How often each quota delayed or refused the tenant's requests, as "
        '"<quota>:delayed" and "<quota>:refused" counts from every gateway (shown by GET '
        "/v1/tenants/{id}; empty in lists). Counted since the quota counters were last "
        "emptied (a restart, embedded).",
    )


class TenantList(BaseModel):
    tenants: list[TenantOut]
    next_after: str | None = None


class TenantDelete(Strict):
    purge: bool = Field(
        False,
        description="false (keep): the tenant is disabled for good, its keys revoked and its "
        "live sandboxes ended; its records stay, for the bill. true (purge): its final "
        "invocations with their outputs, functions, snapshots, stopped sandboxes' records "
        "and console sessions are removed as well; the tenant's row, revoked keys and usage "
        "stay. Safe to ask again: a purge removes what it had to leave the last time.",
    )


class TenantDeleted(BaseModel):
    tenant: TenantOut
    sandboxes_ended: int = Field(description="live sandboxes this call destroyed")
    purged: dict[str, int] = Field(
        default_factory=dict, description="rows this call removed, by kind (a purge)"
    )
    remaining: dict[str, int] = Field(
        default_factory=dict,
        description="what a purge could not remove yet (open invocations, sandboxes not yet "
        "stopped and metered, snapshots a node kept): ask again to remove it",
    )


class KeyCreate(Strict):
    name: Label = ""


class KeyOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    tenant_id: str
    name: str
    created_at: datetime
    revoked_at: datetime | None = None
    last_used_at: datetime | None = Field(
        default=None, description="its last use, stored by each gateway once a minute"
    )


class KeyList(BaseModel):
    keys: list[KeyOut]


class NewKeyOut(KeyOut):
    api_key: str = Field(description="The whole key. Shown once; store it now.")


class TenantCreated(BaseModel):
    tenant: TenantOut
    key: NewKeyOut
