"""``NsjailBackend``: the FnCall backend that runs each call in a warm, per-tenant jail.

Jails come from the shared warm-pool framework (``node.pools.Pool``) with
``JailWorkers`` as the factory: one pool key per (language, tenant) plus a spare key per
language (``node.fncall.nsjail.workers``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from node.fncall.base import FnBackend
from node.fncall.nsjail import cgroups, command, request, results, sharedfs, zygote
from node.fncall.nsjail.config import MIB, NsjailConfig
from node.fncall.nsjail.jail import Jail, JailDied, JailError, JailTimeout
from node.fncall.nsjail.languages import StagePlan, detect, probe_version
from node.fncall.nsjail.languages import plan as plan_stages
from node.fncall.nsjail.stagelimits import StageLimits
from node.fncall.nsjail.workers import JailWorkers, jail_key
from node.pools import IdleCapacity, Pool, PoolError
from node.workfiles import InvalidSpec
from wire.execution import LanguageInfo, RunResult, RunSpec, StageResult, StageStatus

logger = logging.getLogger(__name__)


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000


class NsjailBackend(FnBackend):
    name = "nsjail"

    def __init__(self, config: NsjailConfig | None = None) -> None:
        self.config = config or NsjailConfig()
        self._languages = detect(self.config.languages)
        self._versions: dict[str, str | None] = {}
        self._cgroups: cgroups.CgroupSetup | None = None
        self._command: command.JailCommand | None = None
        self._shared: sharedfs.SharedDir | None = None
        self._pool: Pool[Jail] | None = None
        self._closed = False

    # --- FnBackend protocol --------------------------------------------------------------

    def languages(self) -> Sequence[LanguageInfo]:
        return [
            LanguageInfo(
                name=lang.name,
                runtime=self.name,
                version=self._versions.get(lang.name),
                compiled=lang.compiled,
            )
            for lang in self._languages.values()
        ]

    def stats(self) -> dict[str, int]:
        if self._pool is None:
            return {"warm": 0, "busy": 0, "starting": 0}
        return self._pool.stats()

    def inventory(self) -> dict[str, int]:
        return self._pool.inventory() if self._pool is not None else {}

    def idle_capacity(self) -> dict[str, IdleCapacity]:
        return self._pool.idle_capacity() if self._pool is not None else {}

    @property
    def pool(self) -> Pool[Jail] | None:
        return self._pool

    @property
    def shared_dir(self) -> Path | None:
        """The host directory every jail's generated /etc files and masks come from."""
        return self._shared.path if self._shared is not None else None

    async def start(self) -> None:
        if self._pool is not None or self._closed:
            raise RuntimeError("NsjailBackend.start() may be called once, before close()")
        config = self.config
        try:
            binary = command.nsjail_binary(config)
        except ImportError as exc:
            raise RuntimeError(f"nsjail binary not found: {exc}") from exc
        if not os.access(binary, os.X_OK):
            raise RuntimeError(f"nsjail binary {binary} is missing or not executable")
        if not os.access(config.python_path, os.X_OK):
            raise RuntimeError(f"jail interpreter {config.python_path} is missing")
        if not self._languages:
            raise RuntimeError("no language toolchain for the nsjail runtime on this node")
        setup = cgroups.detect(config)
        if setup.mode is cgroups.CgroupMode.OFF:
            if config.require_cgroups:
                raise RuntimeError(
                    "no usable cgroup hierarchy (need memory and pids controllers); "
                    "run scripts/setup-nsjail.sh, or use dev mode to run without cgroups"
                )
            logger.warning("nsjail runtime without cgroups: memory is bounded by rlimits only")
        setup.ensure_parents(config.jails_memory_mb)
        self._cgroups = setup
        try:
            self._shared = sharedfs.create()
            self._command = command.JailCommand(
                nsjail=binary,
                config=config,
                cgroups=setup,
                shared=self._shared,
                zygote=zygote.source(),
            )
            workers = JailWorkers(self._new_jail, start_timeout_s=config.start_timeout_s)
            self._pool = Pool(workers, config.pool_config(), name=self.name)
            for language in self._languages:
                self._pool.declare(jail_key(language), config.spare_bounds())
            started = time.perf_counter()
            probes = asyncio.gather(*(probe_version(lang) for lang in self._languages.values()))
            outcome = await asyncio.gather(probes, self._pool.start(), return_exceptions=True)
            for failure in outcome:
                if isinstance(failure, BaseException):
                    raise failure
            self._versions = dict(zip(self._languages, await probes, strict=True))
        except BaseException:
            await self.close()
            raise
        logger.info(
            "nsjail runtime started in %.0f ms: languages %s, cgroups %s, %s",
            _ms(started),
            sorted(self._languages),
            setup.mode.value,
            self.stats(),
        )

    async def run(self, spec: RunSpec, *, tenant_id: str, invocation_id: str) -> RunResult:
        started = time.perf_counter()
        pool = self._pool
        if pool is None or self._closed:
            return RunResult(error="the nsjail runtime is not running")
        lang = self._languages.get(spec.language)
        if lang is None:
            return RunResult(
                error=f"language {spec.language!r} is not available on this node "
                f"(have: {', '.join(sorted(self._languages))})"
            )
        if not tenant_id:  # an empty id would name the spare jails' pool key
            return RunResult(error="the nsjail runtime needs a tenant id")
        try:
            request.check(spec, lang, self.config)
        except InvalidSpec as exc:
            logger.info("inv=%s rejected: %s", invocation_id, exc)
            return RunResult(run=StageResult(status=StageStatus.ERROR, message=str(exc)))
        plans = plan_stages(lang, spec, self.config)
        wire = request.build(spec, lang, plans, self.config, id=invocation_id)
        try:
            jail = await pool.acquire(
                jail_key(spec.language, tenant_id),
                spare=jail_key(spec.language),
                context=f"inv={invocation_id}",
            )
        except (JailError, PoolError) as exc:
            logger.warning("inv=%s no jail: %s", invocation_id, exc)
            return RunResult(error=f"no sandbox available: {exc}", setup_ms=_ms(started))
        setup_ms = _ms(started)
        reusable = False
        try:
            result, reusable = await self._call(jail, wire, plans, spec, invocation_id)
        finally:
            teardown = time.perf_counter()
            pool.release(
                jail, reusable=reusable, reason=jail.tainted, context=f"inv={invocation_id}"
            )
        result.setup_ms = setup_ms
        result.teardown_ms += _ms(teardown)
        logger.info(
            "inv=%s tenant=%s lang=%s jail=%s status=%s setup=%.1fms exec=%.1fms",
            invocation_id,
            tenant_id,
            spec.language,
            jail.id,
            result.error or (result.run.status if result.run else None),
            result.setup_ms,
            result.exec_ms,
        )
        return result

    async def close(self) -> None:
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
        if self._shared is not None:
            self._shared.remove()
            self._shared = None

    # --- internals -----------------------------------------------------------------------

    def _new_jail(self, language: str, tenant: str | None) -> Jail:
        assert self._command is not None and self._cgroups is not None
        lang = self._languages[language]
        return Jail(
            jail_id=uuid.uuid4().hex[:12],
            language=language,
            tenant=tenant,
            command=self._command,
            cgroups=self._cgroups,
            extra_ro_binds=lang.ro_binds(),
            initial_memory_bytes=(512 + self.config.jail_overhead_mb) * MIB,
            max_frame_bytes=self.config.max_frame_bytes,
        )

    async def _call(
        self,
        jail: Jail,
        wire: dict[str, object],
        plans: list[StagePlan],
        spec: RunSpec,
        invocation_id: str,
    ) -> tuple[RunResult, bool]:
        """Run one request in ``jail``; returns the result and whether the jail is reusable."""
        limits = StageLimits(
            jail.cgroup, plans, overhead_mb=request.zygote_memory_mb(spec, self.config)
        )
        budget = sum(stage.wall_s for stage in plans) + self.config.host_grace_s
        exec_started = time.perf_counter()
        try:
            limits.enter(0)
            reply = await jail.call(dict(wire), timeout_s=budget, on_stage=limits.enter)
        except JailTimeout as exc:
            logger.error("inv=%s jail=%s %s", invocation_id, jail.id, exc)
            return RunResult(
                error=f"sandbox worker unresponsive: {exc}", exec_ms=_ms(exec_started)
            ), False
        except JailDied as exc:
            limits.settle(len(plans) - 1)
            logger.error(
                "inv=%s jail=%s died (oom=%s): %s", invocation_id, jail.id, limits.oom_stages, exc
            )
            if limits.node_oom_stages and not limits.oom_stages:
                return RunResult(
                    error=results.node_oom_message(spec.limits.memory_mb),
                    exec_ms=_ms(exec_started),
                ), False
            if limits.oom_stages:
                stage = StageResult(
                    status=StageStatus.MEMORY_LIMIT,
                    message=f"memory limit of {spec.limits.memory_mb} MB exceeded: "
                    "the out-of-memory killer ended the sandbox",
                )
                return RunResult(run=stage, exec_ms=_ms(exec_started)), False
            return RunResult(error=f"sandbox worker died: {exc}", exec_ms=_ms(exec_started)), False
        except JailError as exc:
            logger.error("inv=%s jail=%s failure: %s", invocation_id, jail.id, exc)
            return RunResult(error=f"sandbox failure: {exc}", exec_ms=_ms(exec_started)), False
        exec_ms = _ms(exec_started)
        limits.settle(len(reply.get("stages") or [None]) - 1)
        try:
            result = results.run_result(
                reply,
                plans,
                oom_stages=limits.oom_stages,
                node_oom_stages=limits.node_oom_stages,
                max_output=request.output_cap(spec, self.config),
                cgroup_cpu_ms=limits.cpu_ms(),
            )
        except (KeyError, TypeError, ValueError) as exc:
            jail.tainted = f"malformed result: {exc}"
            logger.error("inv=%s jail=%s malformed result: %s", invocation_id, jail.id, exc)
            return RunResult(
                error="sandbox protocol failure: malformed result", exec_ms=exec_ms
            ), False
        result.exec_ms = exec_ms
        leftover = int(reply.get("leftover") or 0)
        if leftover:
            logger.info(
                "inv=%s jail=%s the code left %d processes behind; recycling",
                invocation_id,
                jail.id,
                leftover,
            )
        # The zygote wipes the work dir, /tmp, /dev/shm and SysV IPC and kills strays
        # after replying; that report is collected in the background, and the next call
        # on this jail waits for it (Pool.acquire -> JailWorkers.check -> Jail.settled).
        teardown = time.perf_counter()
        jail.settle_later(invocation_id, timeout_s=self.config.teardown_timeout_s)
        result.teardown_ms = _ms(teardown)
        return result, leftover == 0 and jail.alive
