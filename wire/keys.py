"""Every Redis key Corral uses, in one place. Change a layout here or nowhere.

Streams and their consumer groups:

* ``jobs_for_node(id)``: work the gateway placed on one node (group ``NODE_GROUP``).
* ``jobs(runtime, tenant)``: overflow work of one tenant that any node of that runtime may
  take (group ``NODE_GROUP``); ``queues(runtime)`` is the set of tenants with such a
  stream. Nodes take from these round-robin, one tenant after another, so one tenant's
  backlog never stands in front of another tenant's work.
* ``results(gateway)``: what nodes report about the jobs a gateway dispatched (group
  ``RECORDER_GROUP``); the gateway's recorder stores them, a reconciler adopts the
  stream of a gateway that died.
* ``EVENTS``: node events not tied to one gateway (pool idle capacity), read by every
  recorder (group ``RECORDER_GROUP``).

Keys with a TTL:

* ``inflight(invocation)``: the dispatch marker of one execution: which claim token is
  current, where it was placed and which node claimed it.
* ``node(id)`` / ``gateway(id)``: liveness, refreshed by heartbeats; a node's value is its
  report (capacity, warm inventory).
* ``quota_*``: admission counters.

Plain keys:

* ``AUTH_EPOCH``: a counter every gateway bumps after it revokes a key or changes a
  tenant; every gateway's key cache is dropped when it sees the counter move
  (``app.auth.revocations``).
"""

from __future__ import annotations

PREFIX = "corral"

NODE_GROUP = "corral-nodes"
RECORDER_GROUP = "corral-recorders"

#: Set of node ids that have announced themselves (liveness is ``node(id)``).
NODES = f"{PREFIX}:nodes"
#: Set of gateway ids that have announced themselves (liveness is ``gateway(id)``).
GATEWAYS = f"{PREFIX}:gateways"
#: Stream of node events that belong to no gateway (pool usage).
EVENTS = f"{PREFIX}:events"
#: Counter bumped after every revocation or tenant change (``app.auth.revocations``).
AUTH_EPOCH = f"{PREFIX}:auth:epoch"


def jobs(runtime: str, tenant_id: str) -> str:
    """Overflow stream of one tenant's Jobs for one runtime (``nsjail``, ``wasm``, ...)."""
    return f"{PREFIX}:jobs:{runtime}:tenant:{tenant_id}"


def queues(runtime: str) -> str:
    """Set of the tenants that have an overflow stream for ``runtime``."""
    return f"{PREFIX}:queues:{runtime}"


def tenant_of(stream: str) -> str:
    """The tenant of an overflow stream name (``jobs(runtime, tenant)``)."""
    return stream.rpartition(":tenant:")[2]


def jobs_for_node(node_id: str) -> str:
    """Stream of Jobs placed on one node."""
    return f"{PREFIX}:jobs:node:{node_id}"


def results(gateway_id: str) -> str:
    """Stream of node events (started, finished) for the jobs one gateway dispatched."""
    return f"{PREFIX}:results:{gateway_id}"


def inflight(invocation_id: str) -> str:
    """An execution's dispatch marker (JSON ``wire.messages.Marker``), with a TTL."""
    return f"{PREFIX}:inflight:{invocation_id}"


def node(node_id: str) -> str:
    """A node's liveness key: its NodeReport as JSON, with a TTL refreshed by heartbeats."""
    return f"{PREFIX}:node:{node_id}"


def gateway(gateway_id: str) -> str:
    """A gateway's liveness key, with a TTL refreshed by heartbeats."""
    return f"{PREFIX}:gateway:{gateway_id}"


def quota_tokens(tenant_id: str) -> str:
    """Hash ``{tokens, ts}``: the tenant's executions-per-second token bucket."""
    return f"{PREFIX}:quota:{tenant_id}:tokens"


def quota_sandbox_call_tokens(tenant_id: str) -> str:
    """Hash ``{tokens, ts}``: the tenant's sandbox-calls-per-second token bucket."""
    return f"{PREFIX}:quota:{tenant_id}:sandbox-call-tokens"


def quota_slots(tenant_id: str) -> str:
    """Sorted set of concurrency leases, scored by their expiry time."""
    return f"{PREFIX}:quota:{tenant_id}:slots"


def quota_throttled(tenant_id: str) -> str:
    """Hash ``{"<quota>:<outcome>": count}``: how often each quota delayed or refused the
    tenant (``app.quotas.throttles``), since the counters were last emptied."""
    return f"{PREFIX}:quota:{tenant_id}:throttled"


def quota_waiting(tenant_id: str) -> str:
    """Sorted set of requests waiting in the tenant's admission queue, scored by expiry."""
    return f"{PREFIX}:quota:{tenant_id}:waiting"
