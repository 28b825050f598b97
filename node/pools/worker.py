"""The seam between the pool and a backend: how to start, check, adopt and stop a worker.

A backend implements ``WorkerFactory`` for its workers (a jail, a wasm instance, later a
container or a microVM); the pool (``node.pools.pool``) does all the sizing and
bookkeeping. ``node.pools.fake.FakeFactory`` is an in-process fake for unit tests.

Keys are strings (``wire.messages.pool_key``). A worker belongs to exactly one key for its
whole life, except that a worker of a *spare* key may be ``adopt``-ed by a more specific
key (nsjail binds a spare jail to a tenant); it never moves back or sideways.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol


class Worker(Protocol):
    """What the pool needs of a worker itself: an id for its log lines."""

    @property
    def id(self) -> str: ...


class WorkerFactory[W: Worker](ABC):
    """Starts and stops the workers of one backend.

    ``one_shot``: a one-shot worker serves exactly one call and is then stopped (wasm
    instances); a reusable one goes back to its key after a call unless it is worn or
    tainted (nsjail jails).
    """

    one_shot: bool = False

    @abstractmethod
    async def start(self, key: str) -> W:
        """Start a worker for ``key`` and return it once it is ready to serve a call.

        Runs detached from any caller under the pool's start timeout; on cancellation it
        must release whatever it started. Raise to report a failed start.
        """

    @abstractmethod
    async def stop(self, worker: W) -> None:
        """Stop ``worker`` and release everything it holds. Idempotent; may be called while
        a call still uses it (the pool is closing), which must then fail that call."""

    @abstractmethod
    def alive(self, worker: W) -> bool:
        """Whether ``worker`` can still serve (cheap, no I/O)."""

    async def check(self, worker: W) -> bool:
        """Wait until a reused worker is ready for its next call (e.g. the clean-up of its
        previous call); False if it is not usable. Runs in the acquiring caller."""
        return self.alive(worker)

    def memory_mb(self, worker: W) -> float:
        """Memory ``worker`` holds while it waits idle (for the idle-capacity account)."""
        return 0.0

    def start_cpu_ms(self, worker: W) -> float:
        """CPU time starting ``worker`` used (for the capacity account); 0 if unknown."""
        return 0.0

    def adopt(self, worker: W, key: str) -> None:
        """Move a spare ``worker`` into the more specific ``key`` for good (e.g. bind it to
        a tenant). Only called for the spare key an acquire names."""
        raise NotImplementedError(f"{type(self).__name__} has no spare workers to adopt")
