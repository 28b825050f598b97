"""Every Redis key Corral uses, in one place. Change a layout here or nowhere."""

from __future__ import annotations

PREFIX = "corral"

#: Consumer group that all node agents join on every job stream.
NODE_GROUP = "corral-nodes"
#: Set of the node ids that have registered (their liveness is ``node(id)``).
NODES = f"{PREFIX}:nodes"


def jobs(runtime: str) -> str:
    """Stream of Jobs for one runtime (``nsjail``, ``wasm``, ...)."""
    return f"{PREFIX}:jobs:{runtime}"


def node(node_id: str) -> str:
    """A node's liveness key: its NodeInfo as JSON, with a TTL refreshed by heartbeats."""
    return f"{PREFIX}:node:{node_id}"


def replies(gateway_id: str) -> str:
    """Stream of Completions for one gateway process."""
    return f"{PREFIX}:replies:{gateway_id}"


def quota_tokens(tenant_id: str) -> str:
    """Hash ``{tokens, ts}``: the tenant's executions-per-second token bucket."""
    return f"{PREFIX}:quota:{tenant_id}:tokens"


def quota_slots(tenant_id: str) -> str:
    """Sorted set of concurrency leases, scored by their expiry time."""
    return f"{PREFIX}:quota:{tenant_id}:slots"


def quota_waiting(tenant_id: str) -> str:
    """Sorted set of requests waiting in the tenant's admission queue, scored by expiry."""
    return f"{PREFIX}:quota:{tenant_id}:waiting"
