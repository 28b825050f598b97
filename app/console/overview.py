"""The overview's figures: the live nodes' pools and slots (from the placement
catalogue: the nodes' own reports) and the last minutes' executions (from the record)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from app.db.models import Invocation, utcnow

if TYPE_CHECKING:
    from app.services import Services

#: the window the rates and percentiles are over
WINDOW = timedelta(minutes=5)
#: rows read for the percentiles at most
SAMPLE = 5000


async def snapshot(services: Services, tenant_id: str | None) -> dict[str, Any]:
    """What the overview shows; ``tenant_id``'s executions only (None: everyone's)."""
    nodes = await services.catalogue.nodes()
    backends: dict[str, dict[str, int]] = {}
    for node in nodes:
        for runtime in node.runtimes:
            backends.setdefault(runtime, {"warm": 0, "pools": 0})
        for key, idle in node.warm.items():
            runtime = key.split("/", 1)[0]
            entry = backends.setdefault(runtime, {"warm": 0, "pools": 0})
            entry["warm"] += idle
            entry["pools"] += 1
        for backend in node.sandbox_backends:
            backends.setdefault(backend, {"warm": 0, "pools": 0})
    since = utcnow() - WINDOW
    query = (
        select(Invocation.status, Invocation.created_at, Invocation.finished_at)
        .where(Invocation.created_at >= since)
        .order_by(Invocation.created_at.desc())
        .limit(SAMPLE)
    )
    if tenant_id is not None:
        query = query.where(Invocation.tenant_id == tenant_id)
    async with services.sessions() as session:
        rows = (await session.execute(query)).all()
    finished = [r for r in rows if r.finished_at is not None]
    latencies = sorted((r.finished_at - r.created_at).total_seconds() * 1000 for r in finished)
    return {
        "nodes": [
            {
                "id": n.node_id,
                "slots": n.slots,
                "busy": n.slots - n.slots_free,
                "memory_free_mb": n.memory_free_mb,
                "sandboxes": n.sandboxes,
            }
            for n in sorted(nodes, key=lambda n: n.node_id)
        ],
        "backends": dict(sorted(backends.items())),
        "window_s": int(WINDOW.total_seconds()),
        "executions": len(rows),
        "per_second": round(len(finished) / WINDOW.total_seconds(), 2),
        "running": sum(1 for r in rows if r.status in ("queued", "running")),
        "errors": sum(1 for r in rows if r.status == "errored"),
        "failed": sum(1 for r in rows if r.status == "failed"),
        "p50_ms": _rank(latencies, 0.50),
        "p99_ms": _rank(latencies, 0.99),
    }


def _rank(ordered: list[float], q: float) -> float | None:
    """Nearest-rank percentile."""
    if not ordered:
        return None
    index = max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 1)) - 1))
    return round(ordered[index], 1)
