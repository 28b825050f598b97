"""Tenants, their quotas and their API keys. Keyword-only, one session per call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth import keys
from app.db.models import ApiKey, Quota, Tenant, utcnow
from app.errors import Conflict, NotFound
from app.quotas.spec import QuotaLimits
from wire.ids import new_id


async def create_tenant(
    session: AsyncSession, *, name: str, quota: QuotaLimits, key_name: str = "default"
) -> tuple[Tenant, ApiKey, str]:
    """Create a tenant with its quota row and first key; return the key's plaintext once."""
    tenant = Tenant(id=new_id("ten"), name=name, disabled=False)
    tenant.quota = Quota(limits=quota.model_dump())
    session.add(tenant)
    try:
        await session.flush()
    except IntegrityError as exc:
        raise Conflict(f"a tenant named {name!r} exists already") from exc
    api_key, plaintext = await create_key(session, tenant_id=tenant.id, name=key_name)
    return tenant, api_key, plaintext


async def get_tenant(session: AsyncSession, *, tenant_id: str) -> Tenant:
    tenant = await session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFound(f"no tenant {tenant_id!r}")
    return tenant


async def list_tenants(
    session: AsyncSession, *, limit: int, after: str | None = None
) -> Sequence[Tenant]:
    query = select(Tenant).order_by(Tenant.id).limit(limit)
    if after:
        query = query.where(Tenant.id > after)
    return (await session.scalars(query)).unique().all()


async def update_tenant(
    session: AsyncSession,
    *,
    tenant_id: str,
    name: str | None = None,
    disabled: bool | None = None,
    quota: dict[str, Any] | None = None,
) -> Tenant:
    """Change what is given; ``quota`` replaces the named limits (checked by the caller)."""
    tenant = await get_tenant(session, tenant_id=tenant_id)
    if name is not None:
        tenant.name = name
    if disabled is False and tenant.deleted_at is not None:
        raise Conflict(f"tenant {tenant_id!r} is deleted: it cannot be enabled")
    if disabled is not None:
        tenant.disabled = disabled
    if quota:
        tenant.quota.limits = {**tenant.quota.limits, **quota}
    try:
        await session.flush()
    except IntegrityError as exc:
        raise Conflict(f"a tenant named {name!r} exists already") from exc
    return tenant


async def create_key(
    session: AsyncSession, *, tenant_id: str, name: str = ""
) -> tuple[ApiKey, str]:
    tenant = await get_tenant(session, tenant_id=tenant_id)
    if tenant.deleted_at is not None:
        raise Conflict(f"tenant {tenant_id!r} is deleted: it cannot be given a key")
    new = keys.generate(new_id("key"))
    row = ApiKey(id=new.key_id, tenant_id=tenant_id, name=name, secret_hash=new.secret_hash)
    session.add(row)
    await session.flush()
    return row, new.plaintext


async def list_keys(session: AsyncSession, *, tenant_id: str) -> Sequence[ApiKey]:
    await get_tenant(session, tenant_id=tenant_id)
    query = select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at)
    return (await session.scalars(query)).all()


async def revoke_key(session: AsyncSession, *, tenant_id: str, key_id: str) -> ApiKey:
    row = await session.get(ApiKey, key_id)
    if row is None or row.tenant_id != tenant_id:
        raise NotFound(f"tenant {tenant_id!r} has no key {key_id!r}")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    await session.flush()
    return row


async def find_key(session: AsyncSession, *, key_id: str) -> tuple[ApiKey, Tenant] | None:
    query = select(ApiKey, Tenant).join(Tenant, Tenant.id == ApiKey.tenant_id)
    row = (await session.execute(query.where(ApiKey.id == key_id))).unique().first()
    return (row[0], row[1]) if row else None


async def find_tenant_by_name(session: AsyncSession, *, name: str) -> Tenant | None:
    return (await session.scalars(select(Tenant).where(Tenant.name == name))).unique().first()
