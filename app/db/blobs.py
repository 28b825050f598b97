"""Blobs: the large parts of invocations (``app.db.outputs``), kept for a limited time.

Written in the transaction that stores their invocation (so a part is never referenced
before it exists), read when an answer shows the part in full, deleted once older than the
retention (``delete_older``, run by the reconciler's retention pass) or with their
invocation.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import cast

from sqlalchemy import Connection, Table, bindparam, delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Blob, Invocation
from app.db.outputs import BlobPart

_BLOBS = cast(Table, Blob.__table__)
_INV = cast(Table, Invocation.__table__)

# A blob of an invocation, its tenant taken from the invocation's row.
_INSERT_FOR_ROW = _BLOBS.insert().from_select(
    ["id", "tenant_id", "invocation_id", "name", "size", "content", "created_at"],
    select(
        bindparam("b_blob", type_=_BLOBS.c.id.type),
        _INV.c.tenant_id,
        _INV.c.id,
        bindparam("b_name", type_=_BLOBS.c.name.type),
        bindparam("b_size", type_=_BLOBS.c.size.type),
        bindparam("b_content", type_=_BLOBS.c.content.type),
        # typed as the column: stored as every other time is (not the driver's own format)
        bindparam("b_now", type_=_BLOBS.c.created_at.type),
    ).where(_INV.c.id == bindparam("b_inv")),
)


def insert(
    conn: Connection,
    parts: Sequence[tuple[str, BlobPart]],
    *,
    now: datetime,
) -> None:
    """Store ``(invocation id, part)`` pairs, each under its invocation's tenant."""
    if not parts:
        return
    params = [
        {
            "b_blob": part.id,
            "b_inv": invocation_id,
            "b_name": part.name[:512],
            "b_size": len(part.data),
            "b_content": part.data,
            "b_now": now,
        }
        for invocation_id, part in parts
    ]
    conn.execute(_INSERT_FOR_ROW, params[0] if len(params) == 1 else params)


async def fetch(session: AsyncSession, ids: Sequence[str]) -> dict[str, bytes]:
    """The contents of the blobs that still exist among ``ids``."""
    if not ids:
        return {}
    rows = await session.execute(
        select(_BLOBS.c.id, _BLOBS.c.content).where(_BLOBS.c.id.in_(list(ids)))
    )
    return {row.id: bytes(row.content) for row in rows}


async def used_bytes(session: AsyncSession, tenant_id: str) -> int:
    total = await session.scalar(
        select(func.coalesce(func.sum(_BLOBS.c.size), 0)).where(_BLOBS.c.tenant_id == tenant_id)
    )
    return int(total or 0)


async def delete_older(session: AsyncSession, *, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` blobs created before ``before``; how many."""
    doomed = (
        select(_BLOBS.c.id)
        .where(_BLOBS.c.created_at < before)
        .order_by(_BLOBS.c.created_at)
        .limit(limit)
        .scalar_subquery()
    )
    result = await session.execute(delete(_BLOBS).where(_BLOBS.c.id.in_(doomed)))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def delete_of(session: AsyncSession, invocation_ids: Sequence[str]) -> int:
    """Delete the blobs of ``invocation_ids`` (their rows are going); how many."""
    if not invocation_ids:
        return 0
    result = await session.execute(
        delete(_BLOBS).where(_BLOBS.c.invocation_id.in_(list(invocation_ids)))
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]
