"""Authentication: from a request's credentials to the principal it acts as.

Keys come as ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``. A verified key
is trusted for ``auth_cache_seconds`` without a database read; revoking a key or
disabling a tenant through this process drops the cache at once (other gateways
notice within that window).

A request without a key acts as the default tenant only on an endpoint that allows it
(``tenant_or_default``: ``/run_code``) and only when it arrived on the keyless listener
(``app.http.listeners.is_keyless``: a mark in the ASGI scope). Neither the peer address
nor any header is consulted.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker
from starlette.requests import Request

from app.auth import keys
from app.auth.principal import Admin, Principal
from app.db import tenants
from app.db.models import Tenant
from app.errors import AdminRequired, InvalidApiKey, TenantDisabled, Unauthenticated
from app.http.endpoint import Auth
from app.http.listeners import is_keyless
from app.quotas.spec import QuotaLimits
from wire.singleflight import SingleFlight

log = logging.getLogger(__name__)

_ADMIN = Admin()


class Authenticator:
    def __init__(
        self,
        sessions: async_sessionmaker[Any],
        *,
        admin_key: str | None,
        cache_seconds: float,
        default_quota: QuotaLimits,
        default_tenant: str | None = None,
    ) -> None:
        self._default_quota = default_quota
        self._sessions = sessions
        self._admin_key = admin_key
        self._cache_s = cache_seconds
        self._cache: dict[str, tuple[float, Principal]] = {}
        self._lookups: SingleFlight[str, Principal] = SingleFlight("auth")
        self._generation = 0  #: bumped by every ``forget_tenant``
        self._default_tenant = default_tenant
        self._default: tuple[float, Principal] | None = None
        self._tenants: dict[str, tuple[float, Principal]] = {}  #: by tenant id

    async def authenticate(self, request: Request, auth: Auth) -> Principal | Admin | None:
        if auth == "none":
            return None
        presented = presented_key(request)
        if auth == "admin":
            if presented is None:
                raise Unauthenticated()
            if self._admin_key and keys.admin_matches(presented, self._admin_key):
                return _ADMIN
            raise AdminRequired()
        if (
            auth == "tenant_or_admin"
            and presented is not None
            and self._admin_key
            and keys.admin_matches(presented, self._admin_key)
        ):
            return _ADMIN
        if presented is None:
            if auth == "tenant_or_default" and self._default_tenant is not None:
                if is_keyless(request.scope):
                    return await self.default_principal()
                raise Unauthenticated(
                    "an API key is required: keyless access is served only on the keyless "
                    "listener (CORRAL_KEYLESS_PORT or CORRAL_KEYLESS_SOCKET)"
                )
            raise Unauthenticated()
        return await self.tenant_for(presented)

    async def default_principal(self) -> Principal:
        """The default tenant (for keyless requests), cached like a key."""
        assert self._default_tenant is not None
        now = time.monotonic()
        if self._default is not None and now - self._default[0] < self._cache_s:
            return self._default[1]
        async with self._sessions() as session:
            tenant = await tenants.find_tenant_by_name(session, name=self._default_tenant)
        if tenant is None:
            raise InvalidApiKey(f"the default tenant {self._default_tenant!r} does not exist")
        if tenant.disabled:
            raise TenantDisabled()
        principal = Principal(tenant.id, None, self._quota(tenant))
        self._default = (now, principal)
        return principal

    async def tenant_for(self, presented: str) -> Principal:
        hit = self._cache.get(presented)
        if hit is not None and time.monotonic() - hit[0] < self._cache_s:
            return hit[1]
        # the calls in flight when a key's entry expires share one read and check
        return await self._lookups.do(presented, lambda: self._lookup(presented))

    async def _lookup(self, presented: str) -> Principal:
        now, generation = time.monotonic(), self._generation
        parsed = keys.parse(presented)
        if parsed is None:
            raise InvalidApiKey()
        async with self._sessions() as session:
            found = await tenants.find_key(session, key_id=parsed.key_id)
        if found is None:
            raise InvalidApiKey()
        api_key, tenant = found
        if api_key.revoked_at is not None or not keys.matches(parsed, api_key.secret_hash):
            raise InvalidApiKey()
        if tenant.disabled:
            raise TenantDisabled()
        principal = Principal(tenant.id, api_key.id, self._quota(tenant))
        if self._cache_s > 0 and generation == self._generation:
            self._cache[presented] = (now, principal)
        return principal

    async def tenant_principal(self, tenant_id: str) -> Principal:
        """The tenant ``tenant_id`` acting through no key (a sandbox access token it was
        handed: ``app.e2b.tokens``), cached like a key; a disabled tenant is refused."""
        hit = self._tenants.get(tenant_id)
        if hit is not None and time.monotonic() - hit[0] < self._cache_s:
            return hit[1]
        return await self._lookups.do(
            "\0tenant:" + tenant_id, lambda: self._tenant_lookup(tenant_id)
        )

    async def _tenant_lookup(self, tenant_id: str) -> Principal:
        now, generation = time.monotonic(), self._generation
        async with self._sessions() as session:
            tenant = await session.get(Tenant, tenant_id)
        if tenant is None:
            raise InvalidApiKey("the access token's tenant is gone")
        if tenant.disabled:
            raise TenantDisabled()
        principal = Principal(tenant.id, None, self._quota(tenant))
        if self._cache_s > 0 and generation == self._generation:
            self._tenants[tenant_id] = (now, principal)
        return principal

    def principal_of(self, tenant: Tenant, key_id: str | None) -> Principal:
        """The principal of ``tenant`` acting through ``key_id`` (checked by the caller)."""
        return Principal(tenant.id, key_id, self._quota(tenant))

    def _quota(self, tenant: Tenant) -> QuotaLimits:
        return QuotaLimits.stored(tenant.quota.limits, self._default_quota)

    def forget_tenant(self, tenant_id: str) -> None:
        """Drop cached principals of a tenant (after a change to it or its keys); a
        lookup in flight, which may have read the tenant before the change, is not kept."""
        self._generation += 1
        for presented in [k for k, (_, p) in self._cache.items() if p.tenant_id == tenant_id]:
            del self._cache[presented]
        self._tenants.pop(tenant_id, None)
        self._default = None


def presented_key(request: Request) -> str | None:
    """The key of ``Authorization: Bearer`` or else of ``X-API-Key`` (the first of each
    header), read from the request's raw headers in one pass."""
    authorization: bytes | None = None
    api_key: bytes | None = None
    name: bytes
    value: bytes
    for name, value in request.scope["headers"]:
        if name == b"authorization":
            if authorization is None:
                authorization = value
        elif name == b"x-api-key" and api_key is None:
            api_key = value
    if authorization:
        scheme, _, key = authorization.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise InvalidApiKey("Authorization must be 'Bearer <api key>'")
        return key.strip()
    text = api_key.decode("latin-1").strip() if api_key else ""
    return text or None
