"""Who a request acts as."""

from __future__ import annotations

from dataclasses import dataclass

from app.quotas.spec import QuotaLimits


@dataclass(frozen=True, slots=True)
class Principal:
    """A tenant acting through one of its keys (``key_id`` is None for the default tenant)."""

    tenant_id: str
    key_id: str | None
    quota: QuotaLimits


@dataclass(frozen=True, slots=True)
class Admin:
    """The operator, holding the admin key."""
