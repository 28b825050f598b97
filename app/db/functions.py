"""Functions, their immutable versions, aliases and artifacts; always scoped to a tenant.

A function is a name in a tenant; each registration adds a version (numbered 1, 2, ...)
that is never changed afterwards. ``functions.aliases`` maps alias -> version number;
``latest`` always names the newest version and is moved only by registration. Deleting a
function is a soft delete (``deleted_at``): it disappears from every read here, its
versions and artifacts stay for the invocation history. Registering the name again
revives it: the history continues with the next version number and aliases restart
from ``latest``.

Artifacts live in ``function_artifacts``, keyed by (tenant, SHA-256 of the content), so
identical content is stored once per tenant and any host can read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Function, FunctionArtifact, FunctionVersion, utcnow
from app.errors import ArtifactNotFound, Conflict, NotFound, ValidationFailed
from wire.ids import new_id

LATEST = "latest"


@dataclass(slots=True)
class NewVersion:
    """What a registration asks for."""

    name: str
    language: str
    entry_point: str
    input_schema: dict[str, Any]
    limits: dict[str, Any]
    content: bytes
    content_hash: str


def _same(version: FunctionVersion, new: NewVersion) -> bool:
    return (
        version.content_hash == new.content_hash
        and version.language == new.language
        and version.entry_point == new.entry_point
        and version.input_schema == new.input_schema
        and version.limits == new.limits
    )


async def register(
    session: AsyncSession, *, tenant_id: str, new: NewVersion
) -> tuple[Function, FunctionVersion, bool]:
    """Add a version of ``new.name`` (creating the function); returns (function, version,
    created). When ``new`` is identical to the latest version (same content hash,
    language, entry point, schema and limits) that version is returned, ``created=False``.
    """
    fn = await session.scalar(
        select(Function)
        .where(Function.tenant_id == tenant_id, Function.name == new.name)
        .with_for_update()
    )
    now = utcnow()
    if fn is None:
        fn = Function(
            id=new_id("fn"),
            tenant_id=tenant_id,
            name=new.name,
            language=new.language,
            aliases={},
            created_at=now,
        )
        session.add(fn)
    elif fn.deleted_at is not None:
        fn.deleted_at = None
        fn.aliases = {}
    elif LATEST in fn.aliases:
        latest = await _version(session, fn, int(fn.aliases[LATEST]))
        if latest is not None and _same(latest, new):
            return fn, latest, False
    number = (
        await session.scalar(
            select(func.max(FunctionVersion.version)).where(FunctionVersion.function_id == fn.id)
        )
        or 0
    ) + 1
    if await session.get(FunctionArtifact, (tenant_id, new.content_hash)) is None:
        session.add(
            FunctionArtifact(
                tenant_id=tenant_id,
                content_hash=new.content_hash,
                size_bytes=len(new.content),
                content=new.content,
                created_at=now,
            )
        )
    version = FunctionVersion(
        id=new_id("fnv"),
        function_id=fn.id,
        version=number,
        content_hash=new.content_hash,
        language=new.language,
        entry_point=new.entry_point,
        input_schema=new.input_schema,
        limits=new.limits,
        artifact_path="",
        created_at=now,
    )
    session.add(version)
    fn.language = new.language
    fn.aliases = {**fn.aliases, LATEST: number}
    try:
        await session.flush()
    except IntegrityError:
        raise Conflict(
            f"function {new.name!r} was registered concurrently; retry the request"
        ) from None
    return fn, version, True


async def get(session: AsyncSession, *, tenant_id: str, name: str) -> Function:
    """The live function ``name`` of ``tenant_id``; 404 otherwise (another tenant's too)."""
    fn = await session.scalar(
        select(Function).where(
            Function.tenant_id == tenant_id, Function.name == name, Function.deleted_at.is_(None)
        )
    )
    if fn is None:
        raise NotFound(f"no function {name!r}")
    return fn


async def list_for_tenant(session: AsyncSession, *, tenant_id: str | None) -> Sequence[Function]:
    """The live functions of ``tenant_id`` by name (``None``: every tenant's, the
    operator's view)."""
    query = select(Function).where(Function.deleted_at.is_(None))
    if tenant_id is not None:
        query = query.where(Function.tenant_id == tenant_id)
    return (await session.scalars(query.order_by(Function.name, Function.tenant_id))).all()


async def versions(session: AsyncSession, fn: Function) -> Sequence[FunctionVersion]:
    """Every version of ``fn``, newest first."""
    query = (
        select(FunctionVersion)
        .where(FunctionVersion.function_id == fn.id)
        .order_by(FunctionVersion.version.desc())
    )
    return (await session.scalars(query)).all()


async def _version(session: AsyncSession, fn: Function, number: int) -> FunctionVersion | None:
    return await session.scalar(
        select(FunctionVersion).where(
            FunctionVersion.function_id == fn.id, FunctionVersion.version == number
        )
    )


def version_number(fn: Function, ref: str | None) -> int:
    """The number of the version ``ref`` names: a number, an alias, or (None) ``latest``."""
    ref = ref or LATEST
    if ref.isdigit():
        return int(ref)
    if ref in fn.aliases:
        return int(fn.aliases[ref])
    raise NotFound(f"function {fn.name!r} has no version or alias {ref!r}")


async def resolve(session: AsyncSession, fn: Function, ref: str | None) -> FunctionVersion:
    """The version named by ``ref``: a number, an alias, or (None) ``latest``."""
    number = version_number(fn, ref)
    version = await _version(session, fn, number)
    if version is None:
        raise NotFound(f"function {fn.name!r} has no version {number}")
    return version


async def version_by_id(
    session: AsyncSession, *, tenant_id: str, version_id: str
) -> tuple[Function, FunctionVersion]:
    row = await session.execute(
        select(Function, FunctionVersion)
        .join(FunctionVersion, FunctionVersion.function_id == Function.id)
        .where(FunctionVersion.id == version_id, Function.tenant_id == tenant_id)
    )
    found = row.first()
    if found is None:
        raise NotFound(f"no function version {version_id!r}")
    return found[0], found[1]


async def set_alias(
    session: AsyncSession, *, tenant_id: str, name: str, alias: str, version: int
) -> Function:
    if alias == LATEST:
        raise ValidationFailed("the alias 'latest' always names the newest version")
    fn = await get(session, tenant_id=tenant_id, name=name)
    if await _version(session, fn, version) is None:
        raise NotFound(f"function {name!r} has no version {version}")
    fn.aliases = {**fn.aliases, alias: version}
    return fn


async def delete_alias(session: AsyncSession, *, tenant_id: str, name: str, alias: str) -> Function:
    if alias == LATEST:
        raise ValidationFailed("the alias 'latest' cannot be removed")
    fn = await get(session, tenant_id=tenant_id, name=name)
    if alias not in fn.aliases:
        raise NotFound(f"function {name!r} has no alias {alias!r}")
    fn.aliases = {k: v for k, v in fn.aliases.items() if k != alias}
    return fn


async def soft_delete(session: AsyncSession, *, tenant_id: str, name: str) -> None:
    fn = await get(session, tenant_id=tenant_id, name=name)
    fn.deleted_at = utcnow()


async def artifact(session: AsyncSession, *, tenant_id: str, content_hash: str) -> bytes:
    row = await session.get(FunctionArtifact, (tenant_id, content_hash))
    if row is None:
        raise ArtifactNotFound(f"no artifact {content_hash[:12]} of tenant {tenant_id}")
    return bytes(row.content)
