"""Node registration and heartbeats, in the database (what the console shows)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Node, utcnow


async def heartbeat(
    session: AsyncSession, *, node_id: str, runtimes: dict[str, Any], slots: int, state: str = "up"
) -> None:
    row = await session.get(Node, node_id)
    now = utcnow()
    if row is None:
        session.add(
            Node(
                id=node_id,
                runtimes=runtimes,
                slots=slots,
                state=state,
                started_at=now,
                last_heartbeat_at=now,
            )
        )
    else:
        row.runtimes, row.slots, row.state, row.last_heartbeat_at = runtimes, slots, state, now
    await session.flush()


async def list_nodes(session: AsyncSession) -> Sequence[Node]:
    return (await session.scalars(select(Node).order_by(Node.id))).all()
