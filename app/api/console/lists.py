"""The console's lists (invocations, sandboxes, functions): filtered in SQL, sorted by a
whitelisted column (``app.api.console.sorting``), a page at a time, scoped to the user's
tenant (None: the operator, everyone's). Tenants are filtered and sorted by name."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.api.console import names, sorting
from app.api.console.sorting import Order, Sortable
from app.db.models import Function, FunctionVersion, Invocation, Sandbox, Tenant
from app.errors import ValidationFailed
from app.sandboxes import listing

PAGE = 50

INVOCATION_ORDERS: dict[str, Sortable] = {
    "created": Invocation.created_at,
    "status": Invocation.status,
    "kind": Invocation.kind,
    "language": func.coalesce(Invocation.language, ""),
    "tenant": Tenant.name,
}
SANDBOX_ORDERS: dict[str, Sortable] = {
    "created": Sandbox.created_at,
    "state": Sandbox.state,
    "image": Sandbox.image,
    "backend": Sandbox.backend,
    "tenant": Tenant.name,
}
FUNCTION_ORDERS: dict[str, Sortable] = {
    "name": Function.name,
    "language": Function.language,
    "created": Function.created_at,
    "tenant": Tenant.name,
}
#: a function filter naming one version: ``name v3``
_VERSIONED = re.compile(r"^(?P<name>.+) v(?P<number>[0-9]+)$")


@dataclass
class Listed:
    rows: list[Any]
    order: Order
    following: str | None  #: the cursor of the next page, if there is one
    filters: dict[str, str] = field(default_factory=dict)


def when(text: str) -> datetime | None:
    """A time filter: ISO 8601, UTC unless it says otherwise; empty: none."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValidationFailed(f"{text!r} is not a time (2026-12-01T10:00:00Z)") from exc
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


async def _page(
    session: AsyncSession,
    query: Select[Any],
    order: Order,
    row_id: Sortable,
    cursor: str | None,
) -> tuple[list[Any], str | None]:
    found = (await session.execute(sorting.apply(query, order, row_id, cursor, limit=PAGE))).all()
    rows = [r[0] for r in found]
    following = sorting.encode(found[-1][-1], rows[-1].id) if len(found) == PAGE else None
    return rows, following


def _orders(columns: dict[str, Sortable], admin: bool) -> dict[str, Sortable]:
    """A tenant sees only its own rows: no tenant column to sort by."""
    return columns if admin else {k: v for k, v in columns.items() if k != "tenant"}


async def invocations(
    session: AsyncSession,
    *,
    tenant_id: str | None,
    filters: Mapping[str, str],
    sort: str | None,
    cursor: str | None,
) -> Listed:
    """Filters: status, kind, language, function (a name, ``name vN`` or a version's id),
    since and before (created), tenant (the operator: a name or an id)."""
    order = sorting.choose(sort, _orders(INVOCATION_ORDERS, tenant_id is None), "-created")
    query = select(Invocation).join(Tenant, Tenant.id == Invocation.tenant_id)
    if tenant_id is not None:
        query = query.where(Invocation.tenant_id == tenant_id)
    elif filters.get("tenant"):
        query = query.where(Invocation.tenant_id == await _tenant(session, filters["tenant"]))
    for name in ("status", "kind", "language"):
        if filters.get(name):
            query = query.where(getattr(Invocation, name) == filters[name])
    if filters.get("function"):
        query = query.where(Invocation.function_version_id.in_(_versions(filters["function"])))
    since, before = when(filters.get("since", "")), when(filters.get("before", ""))
    if since is not None:
        query = query.where(Invocation.created_at >= since)
    if before is not None:
        query = query.where(Invocation.created_at < before)
    rows, following = await _page(session, query, order, Invocation.id, cursor)
    return Listed(rows, order, following, dict(filters))


async def _tenant(session: AsyncSession, name_or_id: str) -> str:
    """The id of the tenant a filter names (by name or id)."""
    found = await names.tenant_id(session, name_or_id)
    if found is None:
        raise ValidationFailed(f"no tenant named {name_or_id!r}")
    return found


def _versions(text: str) -> Select[Any]:
    """The ids of the function versions a filter names."""
    query = select(FunctionVersion.id).join(Function, Function.id == FunctionVersion.function_id)
    versioned = _VERSIONED.match(text)
    if versioned:
        return query.where(
            Function.name == versioned["name"],
            FunctionVersion.version == int(versioned["number"]),
        )
    return query.where(or_(Function.name == text, FunctionVersion.id == text))


async def sandboxes(
    session: AsyncSession,
    *,
    tenant_id: str | None,
    filters: Mapping[str, str],
    sort: str | None,
    cursor: str | None,
) -> Listed:
    """Filters: state (``live``, one state, or ``any``), image, backend, label
    (``key=value``), since and before (created), tenant (the operator: a name or an id)."""
    order = sorting.choose(sort, _orders(SANDBOX_ORDERS, tenant_id is None), "-created")
    query = select(Sandbox).join(Tenant, Tenant.id == Sandbox.tenant_id)
    if tenant_id is not None:
        query = query.where(Sandbox.tenant_id == tenant_id)
    elif filters.get("tenant"):
        query = query.where(Sandbox.tenant_id == await _tenant(session, filters["tenant"]))
    state = filters.get("state", "live")
    if state != "any":
        query = query.where(Sandbox.state.in_(listing.states(state) or []))
    for name in ("image", "backend"):
        if filters.get(name):
            query = query.where(getattr(Sandbox, name) == filters[name])
    if filters.get("label"):
        key, sep, value = filters["label"].partition("=")
        if not sep or not key:
            raise ValidationFailed("a label filter is key=value")
        dialect = session.get_bind().dialect.name
        query = query.where(listing.meta_is(key.strip(), value.strip(), dialect))
    since, before = when(filters.get("since", "")), when(filters.get("before", ""))
    if since is not None:
        query = query.where(Sandbox.created_at >= since)
    if before is not None:
        query = query.where(Sandbox.created_at < before)
    rows, following = await _page(session, query, order, Sandbox.id, cursor)
    return Listed(rows, order, following, dict(filters))


async def functions(
    session: AsyncSession,
    *,
    tenant_id: str | None,
    filters: Mapping[str, str],
    sort: str | None,
    cursor: str | None,
) -> Listed:
    """Filters: name (a part of it), language, tenant (the operator: a name or an id)."""
    order = sorting.choose(sort, _orders(FUNCTION_ORDERS, tenant_id is None), "name")
    query = (
        select(Function)
        .join(Tenant, Tenant.id == Function.tenant_id)
        .where(Function.deleted_at.is_(None))
    )
    if tenant_id is not None:
        query = query.where(Function.tenant_id == tenant_id)
    elif filters.get("tenant"):
        query = query.where(Function.tenant_id == await _tenant(session, filters["tenant"]))
    if filters.get("name"):
        query = query.where(Function.name.contains(filters["name"], autoescape=True))
    if filters.get("language"):
        query = query.where(Function.language == filters["language"])
    rows, following = await _page(session, query, order, Function.id, cursor)
    return Listed(rows, order, following, dict(filters))


#: each list: how it is read, the columns it sorts by and its default order
KINDS: dict[str, tuple[Callable[..., Awaitable[Listed]], dict[str, Sortable], str]] = {
    "invocations": (invocations, INVOCATION_ORDERS, "-created"),
    "sandboxes": (sandboxes, SANDBOX_ORDERS, "-created"),
    "functions": (functions, FUNCTION_ORDERS, "name"),
}


async def safely(
    kind: str,
    session: AsyncSession,
    *,
    tenant_id: str | None,
    filters: Mapping[str, str],
    sort: str | None,
    cursor: str | None,
) -> tuple[Listed, str | None]:
    """The list ``kind``, or nothing and why (a filter or a cursor that is not valid)."""
    read, columns, default = KINDS[kind]
    try:
        listed = await read(session, tenant_id=tenant_id, filters=filters, sort=sort, cursor=cursor)
    except ValidationFailed as exc:
        order = sorting.choose(sort, _orders(columns, tenant_id is None), default)
        return Listed([], order, None, dict(filters)), exc.message
    return listed, None
