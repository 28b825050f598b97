"""Resolving ``name`` and ``ref`` to a function version without the database on each call.

An invoke names a function and a version (a number, an alias, or ``latest``). Reading the
function's row and its version's row on every call cost two ORM queries (in a py-spy
profile of `fib-c` at concurrency 32, `Session.scalar` was about a fifth of the event
loop's samples; the profiler slows the server several-fold, so this is a share, not a
measured saving). Two caches, one per kind of row:

* a **version** never changes once registered: it is kept (bounded, least recently used
  first out) by ``(function id, number)``;
* a **function** row (its aliases, ``latest`` among them, and whether it is deleted) does
  change: it is kept for ``ttl_s`` seconds, and dropped at once when this process changes
  it (a registration, an alias set or removed, a deletion: the routes call ``forget``).
  Another gateway sees this gateway's change within ``ttl_s``; ``ttl_s = 0`` reads the row
  on every call.

Concurrent misses of one key share one read, so a key that expires under load costs one
query, not one per caller in flight.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker

from app.db import functions as repo
from app.db.models import Function, FunctionVersion
from common.singleflight import SingleFlight

#: Versions kept; each is a small row (its artifact is cached apart, by content hash).
MAX_VERSIONS = 4096


class Resolver:
    def __init__(self, sessions: async_sessionmaker[Any], *, ttl_s: float = 1.0) -> None:
        self._sessions = sessions
        self._ttl_s = ttl_s
        self._functions: dict[tuple[str, str], tuple[float, Function]] = {}
        self._versions: OrderedDict[tuple[str, int], FunctionVersion] = OrderedDict()
        self._reads: SingleFlight[tuple[str, str], Function] = SingleFlight("function")
        self._generation = 0  #: bumped by every ``forget``

    async def resolve(
        self, tenant_id: str, name: str, ref: str | None
    ) -> tuple[Function, FunctionVersion]:
        """The live function ``name`` of ``tenant_id`` and its version ``ref``; 404s."""
        fn = await self._function(tenant_id, name)
        number = repo.version_number(fn, ref)
        version = self._versions.get((fn.id, number))
        if version is not None:
            self._versions.move_to_end((fn.id, number))
            return fn, version
        async with self._sessions() as session:
            version = await repo.resolve(session, fn, str(number))
        self._versions[(fn.id, number)] = version
        while len(self._versions) > MAX_VERSIONS:
            self._versions.popitem(last=False)
        return fn, version

    def forget(self, tenant_id: str, name: str) -> None:
        """This process changed function ``name``: the next call reads it again (and a
        read already in flight, which may have seen the row before the change, is not
        kept)."""
        self._generation += 1
        self._functions.pop((tenant_id, name), None)
        self._reads.forget((tenant_id, name))

    async def _function(self, tenant_id: str, name: str) -> Function:
        key = (tenant_id, name)
        hit = self._functions.get(key)
        if hit is not None and time.monotonic() - hit[0] < self._ttl_s:
            return hit[1]
        return await self._reads.do(key, lambda: self._read(key))

    async def _read(self, key: tuple[str, str]) -> Function:
        generation, read_at = self._generation, time.monotonic()
        async with self._sessions() as session:
            fn = await repo.get(session, tenant_id=key[0], name=key[1])
        if self._ttl_s > 0 and generation == self._generation:
            self._functions[key] = (read_at, fn)
        return fn
