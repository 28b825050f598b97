"""A tenant's own API keys (its key, not the admin's): list them with when each was last
used, make one (shown once), revoke one (the caller's own included: a rotation ends with
it). Revoking reaches every gateway at once (``Authenticator.revoked``)."""

from __future__ import annotations

from app.api.v1.tenants import new_key_out, revoke
from app.db import tenants as repo
from app.http.endpoint import Call, endpoint
from app.schemas.tenants import KeyCreate, KeyList, KeyOut, NewKeyOut

TAGS = ["keys"]


@endpoint(
    "GET",
    "/v1/keys",
    summary="The tenant's API keys, with when each was last used",
    tags=TAGS,
    response=KeyList,
)
async def list_own_keys(call: Call) -> KeyList:
    async with call.services.sessions() as session:
        rows = await repo.list_keys(session, tenant_id=call.tenant.tenant_id)
    return KeyList(keys=[KeyOut.model_validate(k) for k in rows])


@endpoint(
    "POST",
    "/v1/keys",
    summary="Make an API key for the tenant (the whole key is shown once)",
    tags=TAGS,
    body=KeyCreate,
    response=NewKeyOut,
    status=201,
)
async def create_own_key(call: Call) -> NewKeyOut:
    body: KeyCreate = call.body
    async with call.services.sessions.begin() as session:
        key, plaintext = await repo.create_key(
            session, tenant_id=call.tenant.tenant_id, name=body.name
        )
    return new_key_out(key, plaintext)


@endpoint(
    "DELETE",
    "/v1/keys/{key_id}",
    summary="Revoke one of the tenant's API keys",
    tags=TAGS,
    response=KeyOut,
    errors=(404,),
)
async def revoke_own_key(call: Call) -> KeyOut:
    return await revoke(call, call.tenant.tenant_id, call.path["key_id"])


endpoints = [list_own_keys, create_own_key, revoke_own_key]
