"""Jails as pool workers: how the shared pool (``node.pools``) starts, checks, binds
and kills them.

Keys are ``wire.messages.pool_key``: ``nsjail/<language>`` for spare jails that belong to
nobody yet, ``nsjail/<language>/<tenant>`` for jails bound to a tenant. A jail is started
for one key; a spare is bound to a tenant by ``adopt`` on that tenant's first call (the
pool's "take from the key, else from its spare key"). A bound jail never changes tenant,
so a jail is never shared between tenants.
"""

from __future__ import annotations

from collections.abc import Callable

from node.fncall.nsjail.jail import Jail
from node.pools.worker import WorkerFactory
from wire.messages import pool_key

RUNTIME = "nsjail"
MIB = 1024 * 1024

#: builds an unstarted jail for (language, tenant or None for a spare)
JailMaker = Callable[[str, str | None], Jail]


def jail_key(language: str, tenant: str | None = None) -> str:
    """The pool key of ``language``'s jails bound to ``tenant`` (spares: None)."""
    if tenant is not None and not tenant:
        raise ValueError("a jail's tenant id must not be empty")
    return pool_key(RUNTIME, language, tenant)


def parse_key(key: str) -> tuple[str, str | None]:
    """``nsjail/<language>[/<tenant>]`` -> (language, tenant or None)."""
    runtime, _, rest = key.partition("/")
    language, _, tenant = rest.partition("/")
    if runtime != RUNTIME or not language:
        raise ValueError(f"not an nsjail pool key: {key!r}")
    return language, tenant or None


class JailWorkers(WorkerFactory[Jail]):
    """Reusable workers: a jail serves one call at a time, many calls in its life."""

    one_shot = False

    def __init__(self, make: JailMaker, *, start_timeout_s: float) -> None:
        self._make = make
        self._start_timeout_s = start_timeout_s

    async def start(self, key: str) -> Jail:
        language, tenant = parse_key(key)
        jail = self._make(language, tenant)
        await jail.start(self._start_timeout_s)  # kills what it started if it fails
        return jail

    async def stop(self, worker: Jail) -> None:
        await worker.kill()

    def alive(self, worker: Jail) -> bool:
        return worker.alive

    async def check(self, worker: Jail) -> bool:
        """Wait for the previous call's clean-up in the jail (``Jail.settled``)."""
        return await worker.settled()

    def memory_mb(self, worker: Jail) -> float:
        return worker.ready_memory_bytes / MIB

    def start_cpu_ms(self, worker: Jail) -> float:
        return worker.start_cpu_ms

    def adopt(self, worker: Jail, key: str) -> None:
        """Bind a spare jail to the tenant of ``key``, for the rest of its life."""
        language, tenant = parse_key(key)
        if worker.tenant is not None or tenant is None or language != worker.language:
            raise RuntimeError(f"jail {worker.id} ({worker!r}) cannot be bound to {key!r}")
        worker.tenant = tenant
