"""The overview's figures: the live nodes' pools and slots (from the placement
catalogue: the nodes' own reports) and the last minutes' executions (from the record)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from app.api.console.history import rank
from app.db.models import Invocation, utcnow

if TYPE_CHECKING:
    from app.services import Services

#: the window the rates and percentiles are over
WINDOW = timedelta(minutes=5)
#: rows read for the percentiles at most
SAMPLE = 5000
#: a backend's workers (jails, wasm instances, sandboxes) by state, as nodes report them
POOL_STATES = ("warm", "busy", "starting")


async def snapshot(services: Services, tenant_id: str | None) -> dict[str, Any]:
    """What the overview shows; ``tenant_id``'s executions only (None: everyone's)."""
    nodes = await services.catalogue.nodes()
    backends: dict[str, dict[str, int]] = {}
    for node in nodes:
        names = [*node.runtimes, *(["sandboxes"] if node.sandbox_backends else [])]
        for name in names:
            entry = backends.setdefault(name, {**dict.fromkeys(POOL_STATES, 0), "pools": 0})
            for state in POOL_STATES:
                entry[state] += node.pools.get(name, {}).get(state, 0)
        for key in node.warm:  # a pool per key (language, tenant, image)
            name = "sandboxes" if key.startswith("sandbox/") else key.split("/", 1)[0]
            if name in backends:
                backends[name]["pools"] += 1
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
        "p50_ms": rank(latencies, 0.50),
        "p99_ms": rank(latencies, 0.99),
    }
