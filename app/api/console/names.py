"""The names people know things by, for pages that list ids: a tenant's name, a function
version's function name and number (one query each for a page's rows)."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Function, FunctionVersion, Tenant


async def tenants(session: AsyncSession, ids: Iterable[str]) -> dict[str, str]:
    """Tenant id -> name, for the ids given."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = await session.execute(select(Tenant.id, Tenant.name).where(Tenant.id.in_(wanted)))
    return {str(tenant_id): str(name) for tenant_id, name in rows.all()}


async def tenant_id(session: AsyncSession, name_or_id: str) -> str | None:
    """The id of the tenant named, or whose id is, ``name_or_id``; None if none is."""
    found = await session.scalar(
        select(Tenant.id).where(or_(Tenant.name == name_or_id, Tenant.id == name_or_id))
    )
    return None if found is None else str(found)


async def function_versions(session: AsyncSession, ids: Iterable[str | None]) -> dict[str, str]:
    """Function version id -> ``name v<number>``, for the ids given."""
    wanted = sorted({i for i in ids if i})
    if not wanted:
        return {}
    rows = await session.execute(
        select(FunctionVersion.id, Function.name, FunctionVersion.version)
        .join(Function, Function.id == FunctionVersion.function_id)
        .where(FunctionVersion.id.in_(wanted))
    )
    return {version_id: f"{name} v{number}" for version_id, name, number in rows.all()}
