"""Console sessions: a random token in the browser's cookie, its SHA-256 in the database.

Stored in the database, not in one process, so a session works on every gateway of a
cluster and ends everywhere at once. A tenant's session is resolved through the API key
it signed in with on every request (a key revoked or a tenant disabled ends it, within
the authenticator's cache); the operator's holds a fingerprint of the admin key, so a
changed admin key ends it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.auth.authenticator import Authenticator
from app.auth.principal import Admin, Principal
from app.db import tenants
from app.db.models import ConsoleSession, utcnow

log = logging.getLogger(__name__)

COOKIE = "corral_console"
LIFETIME = timedelta(hours=8)
#: expired sessions deleted by each sign-in
SWEEP = 100


@dataclass(frozen=True, slots=True)
class User:
    """Who a console request acts as."""

    principal: Principal | Admin
    csrf: str
    tenant_name: str | None = None

    @property
    def is_admin(self) -> bool:
        return isinstance(self.principal, Admin)

    @property
    def tenant_id(self) -> str | None:
        """The tenant whose rows the user sees (None: the operator, everyone's)."""
        return None if isinstance(self.principal, Admin) else self.principal.tenant_id


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def fingerprint(admin_key: str) -> str:
    return hashlib.sha256(b"corral-console\0" + admin_key.encode()).hexdigest()


class ConsoleSessions:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        authenticator: Authenticator,
        admin_key: str | None,
    ) -> None:
        self._sessions = sessions
        self._authenticator = authenticator
        self._admin_key = admin_key

    async def sign_in(self, presented: str) -> str:
        """A new session for the holder of ``presented`` (the admin key or a tenant's);
        its token. Raises the API's authentication errors for a key that is not valid."""
        now = utcnow()
        row = ConsoleSession(
            csrf=secrets.token_urlsafe(32), created_at=now, expires_at=now + LIFETIME
        )
        if self._authenticator.is_admin(presented):
            row.role, row.admin_fingerprint = "admin", fingerprint(self._admin_key or "")
        else:
            principal = await self._authenticator.tenant_for(presented)
            row.role, row.tenant_id, row.key_id = "tenant", principal.tenant_id, principal.key_id
        token = secrets.token_urlsafe(32)
        row.id = digest(token)
        async with self._sessions.begin() as session:
            expired = select(ConsoleSession.id).where(ConsoleSession.expires_at < now).limit(SWEEP)
            await session.execute(delete(ConsoleSession).where(ConsoleSession.id.in_(expired)))
            session.add(row)
        log.info("console: signed in as %s", row.tenant_id or "admin")
        return token

    async def resolve(self, token: str | None) -> User | None:
        """The user of a session token, or None (no such session, expired, its key gone)."""
        if not token:
            return None
        async with self._sessions() as session:
            row = await session.get(ConsoleSession, digest(token))
            if row is None or row.expires_at <= utcnow():
                return None
            if row.role == "admin":
                current = fingerprint(self._admin_key) if self._admin_key else ""
                if not row.admin_fingerprint or not hmac.compare_digest(
                    row.admin_fingerprint, current
                ):
                    return None
                return User(Admin(), row.csrf)
            if row.key_id is None:
                return None
            found = await tenants.find_key(session, key_id=row.key_id)
        if found is None:
            return None
        api_key, tenant = found
        if api_key.revoked_at is not None or tenant.disabled or tenant.id != row.tenant_id:
            return None
        principal = self._authenticator.principal_of(tenant, api_key.id)
        return User(principal, row.csrf, tenant_name=tenant.name)

    async def sign_out(self, token: str | None) -> None:
        if token:
            async with self._sessions.begin() as session:
                await session.execute(
                    delete(ConsoleSession).where(ConsoleSession.id == digest(token))
                )
