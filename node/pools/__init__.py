"""Warm pools of workers: one framework for every backend (nsjail, wasm; later containers
and microVMs).

Modules, one concept each:

* ``worker``      the seam: ``WorkerFactory`` (start, check, adopt, stop a worker)
* ``config``      ``PoolConfig``: bounds, timeouts, recycling and sizing knobs
* ``sizing``      a key's target from its measured arrival rate and start time
* ``accounting``  idle capacity (worker-seconds, MB-seconds) and starts, per key
* ``keys``        the bookkeeping of one key: idle, busy, waiters, starts in flight
* ``pool``        ``Pool``: acquire/release, merged cold starts, refill, reaper, eviction
* ``errors``      ``PoolError`` and its subclasses
* ``fake``        an in-process factory and a manual clock for unit tests

See docs/ARCHITECTURE.md ("Backends").
"""

from __future__ import annotations

from node.pools.accounting import IdleCapacity
from node.pools.config import PoolConfig
from node.pools.errors import PoolClosed, PoolError, PoolExhausted, StartFailed
from node.pools.pool import Pool
from node.pools.sizing import Bounds
from node.pools.worker import Worker, WorkerFactory

__all__ = [
    "Bounds",
    "IdleCapacity",
    "Pool",
    "PoolClosed",
    "PoolConfig",
    "PoolError",
    "PoolExhausted",
    "StartFailed",
    "Worker",
    "WorkerFactory",
]
