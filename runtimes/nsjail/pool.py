"""Warm jails, kept per (tenant, language) and never shared between tenants.

* ``unassigned[language]``: a few warm jails that belong to nobody yet. The first call of
  a tenant takes one and binds it to that tenant for the rest of its life; a background
  task starts a replacement.
* ``idle[(tenant, language)]``: bound jails between calls, reused most-recent-first.
* ``busy``: jails serving a call.

A jail is recycled (killed; a fresh one is started in the background for the same
tenant) after ``max_uses_per_jail`` calls, after ``max_jail_age_s``, or on any sign of
tampering reported by the caller. Idle bound jails are reaped after ``idle_timeout_s``.
Live plus starting jails never exceed ``max_jails``; when the pool is full, the least
recently used idle jail of another tenant/language is evicted, else the caller waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from runtimes.nsjail.config import NsjailConfig
from runtimes.nsjail.jail import Jail, JailError

logger = logging.getLogger(__name__)

PoolKey = tuple[str, str]  # (tenant, language)
#: builds an unstarted jail for (language, tenant or None for unassigned)
JailFactory = Callable[[str, str | None], Jail]

REFILL_BACKOFF_S = 2.0


class PoolClosed(JailError):
    pass


class PoolExhausted(JailError):
    pass


class JailPool:
    def __init__(
        self, *, config: NsjailConfig, languages: Sequence[str], factory: JailFactory
    ) -> None:
        self._config = config
        self._languages = tuple(languages)
        self._factory = factory
        self._unassigned: dict[str, list[Jail]] = {lang: [] for lang in self._languages}
        self._idle: dict[PoolKey, list[Jail]] = {}
        self._busy: set[Jail] = set()
        self._live: set[Jail] = set()
        self._starting = 0
        self._starting_unassigned: dict[str, int] = dict.fromkeys(self._languages, 0)
        self._changed = asyncio.Event()
        self._refill = asyncio.Event()
        self._start_slots = asyncio.Semaphore(config.start_concurrency)
        self._tasks: set[asyncio.Task[Any]] = set()  # starts: cancelled by close()
        self._kills: set[asyncio.Task[Any]] = set()  # kills: awaited by close()
        self._loops: list[asyncio.Task[None]] = []
        self._closed = False
        self._close_done: asyncio.Future[None] | None = None

    # --- gauges --------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        warm = sum(map(len, self._unassigned.values())) + sum(map(len, self._idle.values()))
        return {"warm": warm, "busy": len(self._busy), "starting": self._starting}

    def jails(self) -> list[Jail]:
        """Every live jail (for tests and diagnostics)."""
        return sorted(self._live, key=lambda jail: jail.id)

    @property
    def closed(self) -> bool:
        return self._closed

    def _room(self) -> int:
        return self._config.max_jails - len(self._live) - self._starting

    # --- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the unassigned warm jails of every language, then the background loops."""
        want = self._config.warm_per_language
        results = await asyncio.gather(
            *(self._start_unassigned(lang) for lang in self._languages for _ in range(want)),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        self._loops = [
            asyncio.create_task(self._refill_loop(), name="nsjail-pool-refill"),
            asyncio.create_task(self._reap_loop(), name="nsjail-pool-reaper"),
        ]

    async def close(self) -> None:
        """Kill every jail, in use or not, and stop the background tasks. Idempotent."""
        if self._close_done is not None:
            await asyncio.shield(self._close_done)
            return
        self._close_done = asyncio.get_running_loop().create_future()
        self._closed = True
        try:
            self._notify()
            for task in self._loops:
                task.cancel()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._loops, *self._tasks, return_exceptions=True)
            await asyncio.gather(*self._kills, return_exceptions=True)
            jails = list(self._live)
            self._live.clear()
            self._busy.clear()
            self._idle.clear()
            for pending in self._unassigned.values():
                pending.clear()
            await asyncio.gather(*(jail.kill() for jail in jails), return_exceptions=True)
            logger.info("nsjail pool closed: %d jails killed", len(jails))
        finally:
            self._close_done.set_result(None)

    # --- acquire / release ---------------------------------------------------------------

    async def acquire(self, tenant: str, language: str, invocation_id: str) -> Jail:
        """A jail of ``language`` that belongs to ``tenant`` (binding a warm one if needed)."""
        if language not in self._unassigned:
            raise PoolExhausted(f"no pool for language {language!r}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.acquire_timeout_s
        while True:
            if self._closed:
                raise PoolClosed("the nsjail pool is closed")
            jail = self._take_idle((tenant, language)) or self._take_unassigned(tenant, language)
            if jail is not None:
                self._busy.add(jail)
                try:
                    usable = await jail.settled()  # its previous call's clean-up
                except BaseException:  # cancelled while waiting: do not leak the slot
                    self._discard(jail)
                    raise
                if not usable:
                    logger.info(
                        "inv=%s jail %s failed to clean up: %s",
                        invocation_id,
                        jail.id,
                        jail.tainted,
                    )
                    self._discard(jail)
                    continue
                logger.debug(
                    "inv=%s tenant=%s got warm jail %s (use %d)",
                    invocation_id,
                    tenant,
                    jail.id,
                    jail.uses + 1,
                )
                return jail
            if self._room() <= 0:
                self._evict_one(keep=(tenant, language))
            if self._room() > 0:
                logger.info(
                    "inv=%s tenant=%s no warm %s jail: starting one",
                    invocation_id,
                    tenant,
                    language,
                )
                return await self._start_bound(tenant, language)
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise PoolExhausted(
                    f"all {self._config.max_jails} jails are busy "
                    f"(waited {self._config.acquire_timeout_s:g}s)"
                )
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await changed.wait()

    def release(self, jail: Jail, *, reusable: bool, invocation_id: str) -> None:
        """Return a jail after a call; it is recycled unless it is healthy and not worn."""
        self._busy.discard(jail)
        reason = self._retire_reason(jail, reusable)
        if reason is None and not self._closed and jail in self._live:
            assert jail.tenant is not None
            jail.last_used = time.monotonic()
            self._idle.setdefault((jail.tenant, jail.language), []).append(jail)
        elif jail in self._live:
            logger.info(
                "inv=%s recycling jail %s of tenant %s: %s",
                invocation_id,
                jail.id,
                jail.tenant,
                reason or "pool closed",
            )
            self._discard(jail)
            if not self._closed and jail.tenant is not None:
                self._spawn(self._replace(jail.tenant, jail.language))
        self._notify()

    def _retire_reason(self, jail: Jail, reusable: bool) -> str | None:
        if not reusable:
            return jail.tainted or "the call left the jail unusable"
        if not jail.alive:
            return jail.tainted or "the jail exited"
        if jail.uses >= self._config.max_uses_per_jail:
            return f"reached {jail.uses} uses"
        if jail.age() >= self._config.max_jail_age_s:
            return "too old"
        return None

    # --- internals -----------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _spawn(self, coro: Coroutine[Any, Any, Any], *, kill: bool = False) -> None:
        task = asyncio.create_task(coro)
        (self._kills if kill else self._tasks).add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._kills.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("nsjail pool task failed: %s", task.exception())

    def _discard(self, jail: Jail) -> None:
        """Forget a jail now (freeing its slot) and kill it in the background."""
        self._live.discard(jail)
        self._busy.discard(jail)
        self._spawn(jail.kill(), kill=True)
        self._refill.set()

    def _usable(self, jail: Jail) -> bool:
        if jail.alive and jail.age() < self._config.max_jail_age_s:
            return True
        logger.info("dropping jail %s: %s", jail.id, jail.tainted or "dead or too old")
        self._discard(jail)
        return False

    def _take_idle(self, key: PoolKey) -> Jail | None:
        idle = self._idle.get(key)
        while idle:
            jail = idle.pop()
            if self._usable(jail):
                return jail
        self._idle.pop(key, None)
        return None

    def _take_unassigned(self, tenant: str, language: str) -> Jail | None:
        spare = self._unassigned[language]
        while spare:
            jail = spare.pop()
            if self._usable(jail):
                jail.tenant = tenant
                self._refill.set()
                return jail
        return None

    def _evict_one(self, keep: PoolKey) -> None:
        """Kill the least recently used idle jail of another key, else a spare of
        another language."""
        candidates = [jail for key, jails in self._idle.items() if key != keep for jail in jails]
        if candidates:
            victim = min(candidates, key=lambda jail: jail.last_used)
            assert victim.tenant is not None
            self._idle[(victim.tenant, victim.language)].remove(victim)
            logger.info("evicting idle jail %s of tenant %s", victim.id, victim.tenant)
            self._discard(victim)
            return
        spares = [
            jail for lang, jails in self._unassigned.items() if lang != keep[1] for jail in jails
        ]
        if spares:
            victim = spares[0]
            self._unassigned[victim.language].remove(victim)
            logger.info("evicting spare %s jail %s", victim.language, victim.id)
            self._discard(victim)

    async def _new_started(self, language: str, tenant: str | None, *, queue: bool) -> Jail:
        """Start a jail, counted in ``starting`` until it is live."""
        self._starting += 1
        try:
            jail = self._factory(language, tenant)
            if queue:
                async with self._start_slots:
                    await jail.start(self._config.start_timeout_s)
            else:
                await jail.start(self._config.start_timeout_s)
        finally:
            self._starting -= 1
        if self._closed:
            await jail.kill()
            raise PoolClosed("the nsjail pool closed while a jail was starting")
        self._live.add(jail)
        return jail

    async def _start_bound(self, tenant: str, language: str) -> Jail:
        jail = await self._new_started(language, tenant, queue=False)
        self._busy.add(jail)
        self._notify()
        return jail

    async def _start_unassigned(self, language: str) -> None:
        self._starting_unassigned[language] += 1
        try:
            jail = await self._new_started(language, None, queue=True)
        finally:
            self._starting_unassigned[language] -= 1
        self._unassigned[language].append(jail)
        self._notify()

    async def _replace(self, tenant: str, language: str) -> None:
        """Keep a tenant warm after one of its jails was recycled."""
        if self._room() <= 0 or self._idle.get((tenant, language)):
            return
        jail = await self._new_started(language, tenant, queue=True)
        jail.last_used = time.monotonic()
        self._idle.setdefault((tenant, language), []).append(jail)
        self._notify()

    async def _refill_loop(self) -> None:
        want = self._config.warm_per_language
        while not self._closed:
            await self._refill.wait()
            self._refill.clear()
            for lang in self._languages:
                while (
                    not self._closed
                    and len(self._unassigned[lang]) + self._starting_unassigned[lang] < want
                    and self._room() > 0
                ):
                    try:
                        await self._start_unassigned(lang)
                    except PoolClosed:
                        return
                    except JailError as exc:
                        logger.warning("cannot refill the %s pool: %s", lang, exc)
                        await asyncio.sleep(REFILL_BACKOFF_S)
                        self._refill.set()
                        break

    async def _reap_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._config.reap_interval_s)
            self.reap()

    def reap(self) -> None:
        """Kill idle jails past their idle timeout or age, and dead spares."""
        now = time.monotonic()
        for key in list(self._idle):
            keep: list[Jail] = []
            for jail in self._idle[key]:
                idle_for = now - jail.last_used
                if idle_for >= self._config.idle_timeout_s or not self._usable(jail):
                    if jail in self._live:
                        logger.info(
                            "reaping jail %s of tenant %s (idle %.0fs)",
                            jail.id,
                            jail.tenant,
                            idle_for,
                        )
                        self._discard(jail)
                else:
                    keep.append(jail)
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]
        for lang, spares in self._unassigned.items():
            self._unassigned[lang] = [jail for jail in spares if self._usable(jail)]
        self._notify()
