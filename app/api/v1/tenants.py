"""Admin API: tenants, their quotas and their API keys."""

from __future__ import annotations

from app.db import tenants as repo
from app.db.models import ApiKey, Tenant
from app.http.endpoint import Call, endpoint
from app.quotas.spec import QuotaLimits
from app.schemas.common import Page
from app.schemas.tenants import (
    KeyCreate,
    KeyList,
    KeyOut,
    NewKeyOut,
    TenantCreate,
    TenantCreated,
    TenantDelete,
    TenantDeleted,
    TenantList,
    TenantOut,
    TenantPatch,
)
from app.tenants.deletion import delete_tenant as delete

TAGS = ["tenants"]


@endpoint(
    "POST",
    "/v1/tenants",
    summary="Create a tenant and its first API key",
    tags=TAGS,
    auth="admin",
    body=TenantCreate,
    response=TenantCreated,
    status=201,
    errors=(409,),
)
async def create_tenant(call: Call) -> TenantCreated:
    body: TenantCreate = call.body
    quota = call.services.settings.quota.limits().merged(body.quota)
    async with call.services.sessions.begin() as session:
        tenant, key, plaintext = await repo.create_tenant(
            session, name=body.name, quota=quota, key_name=body.key_name
        )
    return TenantCreated(tenant=_tenant_out(call, tenant), key=new_key_out(key, plaintext))


@endpoint(
    "GET",
    "/v1/tenants",
    summary="List tenants",
    tags=TAGS,
    auth="admin",
    query=Page,
    response=TenantList,
)
async def list_tenants(call: Call) -> TenantList:
    page: Page = call.query
    async with call.services.sessions() as session:
        rows = await repo.list_tenants(session, limit=page.limit, after=page.after)
    return TenantList(
        tenants=[_tenant_out(call, t) for t in rows],
        next_after=rows[-1].id if len(rows) == page.limit else None,
    )


@endpoint(
    "GET",
    "/v1/tenants/{tenant_id}",
    summary="Show a tenant",
    tags=TAGS,
    auth="admin",
    response=TenantOut,
)
async def get_tenant(call: Call) -> TenantOut:
    async with call.services.sessions() as session:
        tenant = await repo.get_tenant(session, tenant_id=call.path["tenant_id"])
    out = _tenant_out(call, tenant)
    out.throttled = await call.services.counters.throttles(tenant.id)
    return out


@endpoint(
    "PATCH",
    "/v1/tenants/{tenant_id}",
    summary="Rename, disable or enable a tenant, or change its quotas",
    tags=TAGS,
    auth="admin",
    body=TenantPatch,
    response=TenantOut,
    errors=(409,),
)
async def update_tenant(call: Call) -> TenantOut:
    body: TenantPatch = call.body
    tenant_id = call.path["tenant_id"]
    async with call.services.sessions.begin() as session:
        tenant: Tenant = await repo.update_tenant(
            session,
            tenant_id=tenant_id,
            name=body.name,
            disabled=body.disabled,
            quota=body.quota.model_dump(exclude_none=True) if body.quota else None,
        )
        out = _tenant_out(call, tenant)
    await call.services.authenticator.revoked(tenant_id)
    return out


@endpoint(
    "DELETE",
    "/v1/tenants/{tenant_id}",
    summary="Delete a tenant: keep its records, or purge them",
    tags=TAGS,
    auth="admin",
    query=TenantDelete,
    response=TenantDeleted,
)
async def delete_tenant(call: Call) -> TenantDeleted:
    """Disable the tenant for good, revoke its keys, end its live sandboxes; with
    ``purge`` remove its content too (``app.tenants.deletion``). Asking again finishes
    what the last call left (``remaining``)."""
    done = await delete(call.services, call.path["tenant_id"], purge=call.query.purge)
    return TenantDeleted(
        tenant=_tenant_out(call, done.tenant),
        sandboxes_ended=done.sandboxes_ended,
        purged=done.purged,
        remaining=done.remaining,
    )


@endpoint(
    "POST",
    "/v1/tenants/{tenant_id}/keys",
    summary="Create an API key",
    tags=TAGS,
    auth="admin",
    body=KeyCreate,
    response=NewKeyOut,
    status=201,
    errors=(409,),
)
async def create_key(call: Call) -> NewKeyOut:
    body: KeyCreate = call.body
    async with call.services.sessions.begin() as session:
        key, plaintext = await repo.create_key(
            session, tenant_id=call.path["tenant_id"], name=body.name
        )
    return new_key_out(key, plaintext)


@endpoint(
    "GET",
    "/v1/tenants/{tenant_id}/keys",
    summary="List a tenant's API keys",
    tags=TAGS,
    auth="admin",
    response=KeyList,
)
async def list_keys(call: Call) -> KeyList:
    async with call.services.sessions() as session:
        rows = await repo.list_keys(session, tenant_id=call.path["tenant_id"])
    return KeyList(keys=[KeyOut.model_validate(k) for k in rows])


@endpoint(
    "DELETE",
    "/v1/tenants/{tenant_id}/keys/{key_id}",
    summary="Revoke an API key",
    tags=TAGS,
    auth="admin",
    response=KeyOut,
)
async def revoke_key(call: Call) -> KeyOut:
    return await revoke(call, call.path["tenant_id"], call.path["key_id"])


async def revoke(call: Call, tenant_id: str, key_id: str) -> KeyOut:
    """Revoke the tenant's key ``key_id``; every gateway refuses it at once."""
    async with call.services.sessions.begin() as session:
        key = await repo.revoke_key(session, tenant_id=tenant_id, key_id=key_id)
        out = KeyOut.model_validate(key)
    await call.services.authenticator.revoked(tenant_id)
    return out


def _tenant_out(call: Call, tenant: Tenant) -> TenantOut:
    return TenantOut(
        id=tenant.id,
        name=tenant.name,
        disabled=tenant.disabled,
        created_at=tenant.created_at,
        deleted_at=tenant.deleted_at,
        purged_at=tenant.purged_at,
        quota=QuotaLimits.stored(tenant.quota.limits, call.services.settings.quota.limits()),
    )


def new_key_out(key: ApiKey, plaintext: str) -> NewKeyOut:
    return NewKeyOut(
        id=key.id,
        tenant_id=key.tenant_id,
        name=key.name,
        created_at=key.created_at,
        revoked_at=key.revoked_at,
        api_key=plaintext,
    )


endpoints = [
    create_tenant,
    list_tenants,
    get_tenant,
    update_tenant,
    delete_tenant,
    create_key,
    list_keys,
    revoke_key,
]
