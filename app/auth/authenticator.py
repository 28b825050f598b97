"""Authentication: from a request's credentials to the principal it acts as.

Every surface reads its credential with ``app.auth.credentials.presented`` (the API:
``Authorization: Bearer <key>`` or ``X-API-Key: <key>``; two different keys are 400
``conflicting_credentials``) and verifies a tenant key here, through one cache
(``app.auth.cache``: by a digest of the key, bounded, ``auth_cache_seconds`` per entry).
Revoking a key or disabling or changing a tenant evicts the tenant here at once and, in
a cluster, on every gateway within ``auth_revocation_check_seconds``
(``app.auth.revocations``).

A request without a key acts as the default tenant only on an endpoint that allows it
(``tenant_or_default``: ``/run_code``) and only when it arrived on the keyless listener
(``app.http.listeners.is_keyless``: a mark in the ASGI scope). Neither the peer address
nor any header is consulted.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker
from starlette.requests import Request

from app.auth import credentials, keys
from app.auth.cache import Digest, KeyCache
from app.auth.key_use import KeyUse
from app.auth.principal import Admin, Principal
from app.auth.revocations import LocalRevocations, Revocations
from app.db import tenants
from app.db.models import Tenant
from app.errors import AdminRequired, InvalidApiKey, TenantDisabled, Unauthenticated
from app.http.endpoint import Auth
from app.http.listeners import is_keyless
from app.quotas.spec import QuotaLimits
from common.singleflight import SingleFlight

log = logging.getLogger(__name__)

_ADMIN = Admin()
#: What the default tenant's and a tenant's own (token) principals are cached under:
#: never a valid key (keys are ``crl_...``), so never a key's digest either.
_DEFAULT = "\0default"
_TENANT = "\0tenant:"


class Authenticator:
    def __init__(
        self,
        sessions: async_sessionmaker[Any],
        *,
        admin_key: str | None,
        cache: KeyCache,
        default_quota: QuotaLimits,
        default_tenant: str | None = None,
        revocations: Revocations | None = None,
        key_use: KeyUse | None = None,
    ) -> None:
        """``key_use``: where each key's use is noted (its last use shown to its owner)."""
        self._default_quota = default_quota
        self.key_use = key_use
        self._sessions = sessions
        self._admin_key = admin_key
        self.cache = cache
        self._revocations = revocations or LocalRevocations()
        #: by digest and cache generation: a call after an eviction never joins a look-up
        #: that started before it
        self._lookups: SingleFlight[tuple[Digest, int], Principal] = SingleFlight("auth")
        self._default_tenant = default_tenant

    async def authenticate(self, request: Request, auth: Auth) -> Principal | Admin | None:
        if auth == "none":
            return None
        presented = credentials.presented(request, credentials.API)
        if auth == "admin":
            if presented is None:
                raise Unauthenticated()
            if self.is_admin(presented):
                return _ADMIN
            raise AdminRequired()
        if auth == "tenant_or_admin" and presented is not None and self.is_admin(presented):
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

    def is_admin(self, presented: str) -> bool:
        return bool(self._admin_key) and keys.admin_matches(presented, self._admin_key or "")

    async def default_principal(self) -> Principal:
        """The default tenant (for keyless requests), cached like a key."""
        assert self._default_tenant is not None
        return await self._cached(_DEFAULT, self._default_lookup)

    async def tenant_for(self, presented: str) -> Principal:
        """The principal of a tenant key (401 ``invalid_api_key``, 403 ``tenant_disabled``)."""
        principal = await self._cached(presented, lambda: self._lookup(presented))
        if self.key_use is not None and principal.key_id is not None:
            self.key_use.note(principal.key_id)
        return principal

    async def tenant_principal(self, tenant_id: str) -> Principal:
        """The tenant ``tenant_id`` acting through no key (a sandbox access token it was
        handed: ``app.api.e2b.tokens``), cached like a key; a disabled tenant is refused."""
        return await self._cached(_TENANT + tenant_id, lambda: self._tenant_lookup(tenant_id))

    async def _cached(self, name: str, lookup: Any) -> Principal:
        digest = self.cache.digest(name)
        if digest in self.cache:
            await self._revocations.check(self.cache)
            hit = self.cache.get(digest)
            if hit is not None:
                return hit
        # the calls in flight when an entry expires share one read and check
        generation = self.cache.generation

        async def read() -> Principal:
            principal: Principal = await lookup()
            self.cache.put(digest, principal, generation=generation)
            return principal

        return await self._lookups.do((digest, generation), read)

    async def _lookup(self, presented: str) -> Principal:
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
        return Principal(tenant.id, api_key.id, self._quota(tenant))

    async def _default_lookup(self) -> Principal:
        async with self._sessions() as session:
            tenant = await tenants.find_tenant_by_name(session, name=self._default_tenant or "")
        if tenant is None:
            raise InvalidApiKey(f"the default tenant {self._default_tenant!r} does not exist")
        if tenant.disabled:
            raise TenantDisabled()
        return Principal(tenant.id, None, self._quota(tenant))

    async def _tenant_lookup(self, tenant_id: str) -> Principal:
        async with self._sessions() as session:
            tenant = await session.get(Tenant, tenant_id)
        if tenant is None:
            raise InvalidApiKey("the access token's tenant is gone")
        if tenant.disabled:
            raise TenantDisabled()
        return Principal(tenant.id, None, self._quota(tenant))

    def principal_of(self, tenant: Tenant, key_id: str | None) -> Principal:
        """The principal of ``tenant`` acting through ``key_id`` (checked by the caller)."""
        return Principal(tenant.id, key_id, self._quota(tenant))

    def _quota(self, tenant: Tenant) -> QuotaLimits:
        return QuotaLimits.stored(tenant.quota.limits, self._default_quota)

    async def revoked(self, tenant_id: str) -> None:
        """A key of ``tenant_id`` was revoked, or the tenant changed (committed): drop its
        cached principals here at once, and tell the other gateways."""
        self.cache.evict_tenant(tenant_id)
        await self._revocations.announce()
