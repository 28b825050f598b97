"""``WasmRuntime``: the WebAssembly FnCall backend (``Runtime`` implementation).

Interpreter languages run on a warm instance from the shared warm-pool framework
(``runtimes.pools.Pool`` with ``WasmWorkers``, one key per interpreter; one call each,
then discarded); raw modules get a fresh instance from their cached ``InstancePre``. Both
report through the same path: arm the limits, let the guest run, wait for its outcome
(with a host backstop past the epoch deadline), map it to a ``StageResult``.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Sequence

from wasmtime import _wasi as wasmtime_wasi

from runtimes.base import Runtime
from runtimes.pools import IdleCapacity, Pool, PoolClosed, PoolError
from runtimes.wasm import languages, results
from runtimes.wasm.bootstrap import READY_MARKER
from runtimes.wasm.cache import ModuleCache
from runtimes.wasm.config import MIB, WasmConfig
from runtimes.wasm.engine import WasmEngine
from runtimes.wasm.instance import CallLimits, Instance, Outcome, StoreCaps
from runtimes.wasm.languages import INTERPRETERS, Interpreter
from runtimes.wasm.modules import InterpreterError, LoadedModule, ModuleLoader, ModuleLoadError
from runtimes.wasm.output import OutputCapture
from runtimes.wasm.workdir import HostDir, decode_files
from runtimes.wasm.workers import WarmupError, WasmWorkers
from runtimes.workfiles import InvalidSpec
from wire.execution import LanguageInfo, RunResult, RunSpec, StageResult, StageStatus
from wire.messages import pool_key

log = logging.getLogger(__name__)

OUTPUT_RELEASE_TIMEOUT_S = 2.0


class WasmRuntime(Runtime):
    name = "wasm"

    def __init__(self, config: WasmConfig | None = None) -> None:
        self.config = config or WasmConfig()
        cfg = self.config
        self._paths = languages.available(cfg)
        self._raw = languages.raw_wanted(cfg)
        self._caps = StoreCaps(
            table_elements=cfg.max_table_elements,
            instances=cfg.max_instances,
            tables=cfg.max_tables,
            memories=cfg.max_memories,
        )
        self._run_dir = cfg.resolved_run_dir / f"{os.getpid()}-{secrets.token_hex(4)}"
        self._names = itertools.count(1)
        self._engine: WasmEngine | None = None
        self._loader: ModuleLoader | None = None
        self._pool: Pool[Instance] | None = None
        self._interpreters: dict[str, LoadedModule] = {}
        self._live: set[Instance] = set()
        self._busy: set[Instance] = set()
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    @property
    def interpreters(self) -> dict[str, LoadedModule]:
        """The interpreter modules loaded by ``start()``, by language."""
        return dict(self._interpreters)

    @property
    def engine_fingerprint(self) -> str | None:
        """Names the engine configuration (and so the cache directory); None before start."""
        return self._engine.fingerprint if self._engine is not None else None

    # --- Runtime protocol ---------------------------------------------------------------
    def languages(self) -> Sequence[LanguageInfo]:
        offered = [
            LanguageInfo(name=name, runtime=self.name, version=INTERPRETERS[name].version)
            for name in self._paths
        ]
        if self._raw:
            offered.append(
                LanguageInfo(
                    name=languages.RAW_LANGUAGE, runtime=self.name, version=languages.RAW_VERSION
                )
            )
        return offered

    async def start(self) -> None:
        if self._started or self._closed:
            return
        cfg = self.config
        self._clean_stale_run_dirs()
        self._engine = engine = WasmEngine(cfg)
        engine.start()
        cache = ModuleCache(
            cfg.resolved_cache_dir, engine.fingerprint, max_bytes=cfg.cache_max_bytes
        )
        self._loader = ModuleLoader(
            engine,
            cache,
            memory_slots=cfg.module_memory_slots,
            max_module_bytes=cfg.max_module_bytes,
        )
        for name, path in list(self._paths.items()):
            interp = INTERPRETERS[name]
            try:
                loaded = await asyncio.to_thread(
                    self._loader.load_file, name, path, sha256=interp.sha256
                )
            except InterpreterError:
                if cfg.strict_interpreters:
                    raise
                log.warning("wasm: dropping %s", name, exc_info=True)
                del self._paths[name]
                continue
            self._interpreters[name] = loaded
        if self._closed:  # close() ran while the interpreters loaded
            return
        self._pool = pool = self._make_pool()
        self._started = True
        try:
            await pool.start()
        except PoolClosed:
            return
        except Exception as exc:  # the refill goes on trying, backing off
            log.warning("wasm: warming the pools failed: %s", exc)
        log.info("wasm: started with %s", [lang.name for lang in self.languages()])

    async def run(self, spec: RunSpec, *, tenant_id: str, invocation_id: str) -> RunResult:
        if not self._started or self._closed:
            return RunResult(error="the wasm runtime is not running")
        try:
            if spec.language in self._interpreters:
                return await self._run_interpreter(spec, invocation_id)
            if spec.language == languages.RAW_LANGUAGE and self._raw:
                return await self._run_module(spec, invocation_id)
        except InvalidSpec as exc:
            log.info("invocation %s: rejected: %s", invocation_id, exc)
            return RunResult(run=StageResult(status=StageStatus.ERROR, message=str(exc)))
        return RunResult(error=f"the wasm runtime does not offer language {spec.language!r}")

    def stats(self) -> dict[str, int]:
        """Warm and starting instances of the pools; busy: every instance running a call
        (raw modules included)."""
        gauges = self._pool.stats() if self._pool is not None else {}
        with self._lock:
            busy = len(self._busy)
        return {"warm": gauges.get("warm", 0), "busy": busy, "starting": gauges.get("starting", 0)}

    def inventory(self) -> dict[str, int]:
        return self._pool.inventory() if self._pool is not None else {}

    def idle_capacity(self) -> dict[str, IdleCapacity]:
        return self._pool.idle_capacity() if self._pool is not None else {}

    async def close(self) -> None:
        """Abort every instance, join every thread, then stop the ticker. Idempotent."""
        if self._closed:
            return
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
        with self._lock:
            live = list(self._live)
        for inst in live:
            inst.abort()
        engine = self._engine
        if engine is not None:
            engine.interrupt_all()
        for inst in live:
            inst.dispose()
        stuck = await asyncio.to_thread(self._join, live, self.config.close_timeout_s)
        if stuck:
            log.error("wasm: %d instance threads did not stop: %s", len(stuck), stuck)
        await _outputs_released(OUTPUT_RELEASE_TIMEOUT_S)
        if engine is not None:
            engine.close()
        self._interpreters.clear()
        self._loader = None
        shutil.rmtree(self._run_dir, ignore_errors=True)
        log.info("wasm: closed")

    # --- interpreters -------------------------------------------------------------------
    def _make_pool(self) -> Pool[Instance]:
        """One pool for every interpreter loaded, a key per interpreter."""
        makers = {
            pool_key(self.name, name): (name, self._warm_maker(INTERPRETERS[name], loaded))
            for name, loaded in self._interpreters.items()
        }
        pool = Pool(WasmWorkers(makers), self.config.pool_config(), name=self.name)
        for key in makers:
            pool.declare(key, self.config.interpreter_bounds())
        return pool

    def _warm_maker(self, interp: Interpreter, loaded: LoadedModule) -> Callable[[], Instance]:
        cfg = self.config
        argv = interp.argv(cfg)
        warmup = CallLimits(
            memory_bytes=cfg.warmup_memory_mb * MIB,
            timeout_s=cfg.warmup_timeout_s,
            max_output=0,
        )

        def make() -> Instance:
            return self._new_instance(loaded, argv=argv, limits=warmup, warm=True)

        return make

    async def _run_interpreter(self, spec: RunSpec, invocation_id: str) -> RunResult:
        started = time.perf_counter()
        interp = INTERPRETERS[spec.language]
        files = decode_files(spec, max_bytes=self.config.max_input_bytes)
        if interp.source_file is not None:
            if interp.source_file in files:
                raise InvalidSpec(
                    f"file {interp.source_file!r} would overwrite the program's source file"
                )
            files[interp.source_file] = spec.code.encode("utf-8", "replace")
        pool = self._pool
        if pool is None:
            return RunResult(error="the wasm runtime is not running")
        context = f"inv={invocation_id}"
        try:
            inst = await pool.acquire(pool_key(self.name, spec.language), context=context)
        except (PoolError, WarmupError) as exc:
            log.error("invocation %s: %s", invocation_id, exc)
            return RunResult(error=str(exc), setup_ms=_ms(started))
        try:
            return await self._call(
                inst,
                spec,
                files,
                invocation_id,
                started=started,
                payload=interp.payload(spec.code, spec.stdin),
                oom_markers=interp.oom_markers,
            )
        finally:
            pool.release(inst, context=context)

    # --- raw modules --------------------------------------------------------------------
    async def _run_module(self, spec: RunSpec, invocation_id: str) -> RunResult:
        started = time.perf_counter()
        files = decode_files(spec, max_bytes=self.config.max_input_bytes)
        data = files.pop(languages.RAW_MODULE_FILE, None)
        if data is None:
            raise InvalidSpec(
                f"language {languages.RAW_LANGUAGE!r} needs the module as base64 in "
                f"files[{languages.RAW_MODULE_FILE!r}]"
            )
        assert self._loader is not None
        try:
            loaded = self._loader.cached(hashlib.sha256(data).hexdigest())
            if loaded is None:  # compiling or reading the disk cache: off the event loop
                loaded = await asyncio.to_thread(self._loader.load_bytes, data)
        except ModuleLoadError as exc:
            log.info("invocation %s: module refused: %s", invocation_id, exc)
            return RunResult(
                run=StageResult(status=StageStatus.ERROR, message=str(exc)),
                setup_ms=_ms(started),
            )
        inst = self._new_instance(
            loaded,
            argv=[languages.RAW_MODULE_FILE],
            limits=self._limits(spec),
            warm=False,
            stdin_data=spec.stdin.encode("utf-8", "replace"),
        )
        return await self._call(inst, spec, files, invocation_id, started=started)

    # --- one call -----------------------------------------------------------------------
    def _limits(self, spec: RunSpec) -> CallLimits:
        return CallLimits(
            memory_bytes=spec.limits.memory_mb * MIB,
            timeout_s=spec.limits.run_timeout_s,
            max_output=spec.limits.max_output_bytes,
            fuel=self.config.fuel_per_call,
        )

    async def _call(
        self,
        inst: Instance,
        spec: RunSpec,
        files: dict[str, bytes],
        invocation_id: str,
        *,
        started: float,
        payload: bytes | None = None,
        oom_markers: tuple[str, ...] = (),
    ) -> RunResult:
        """Run ``inst`` for ``spec``: a warm instance gets ``payload``, a fresh one starts."""
        limits = self._limits(spec)
        outcome: Outcome | None = None
        fetched: dict[str, str] = {}
        notes: list[str] = []
        with self._lock:
            self._busy.add(inst)
        try:
            inst.host_dir.write_files(files)
            exec_started = time.perf_counter()
            if payload is not None:
                inst.arm(limits)
                exec_started = time.perf_counter()
                inst.feed(payload, asyncio.get_running_loop())
            else:
                inst.start()
            waiting = asyncio.wrap_future(inst.outcome)
            try:
                outcome = await asyncio.wait_for(
                    asyncio.shield(waiting), limits.timeout_s + self.config.host_grace_s
                )
            except TimeoutError:
                log.error(
                    "invocation %s: instance %s ignored its deadline; abandoned",
                    invocation_id,
                    inst.id,
                )
            exec_done = time.perf_counter()
            stage = results.stage_result(
                outcome,
                limits,
                stdout=inst.stdout,
                stderr=inst.stderr,
                oom_markers=oom_markers,
                wall_ms=(exec_done - exec_started) * 1000,
            )
            if spec.fetch_files and outcome is not None:
                fetched, notes = inst.host_dir.read_files(
                    spec.fetch_files, max_bytes=self.config.max_fetch_bytes
                )
                if notes:
                    text = "; ".join(notes)
                    stage.message = f"{stage.message}; {text}" if stage.message else text
        finally:
            with self._lock:
                self._busy.discard(inst)
            if not inst.done.is_set():
                inst.abort()
            inst.dispose()
        finished = time.perf_counter()
        log.info(
            "invocation %s: %s %s (exit %s) in %.1f ms on %s",
            invocation_id,
            spec.language,
            stage.status,
            stage.exit_code,
            stage.wall_ms,
            inst.id,
        )
        return RunResult(
            run=stage,
            files=fetched,
            setup_ms=(exec_started - started) * 1000,
            exec_ms=(exec_done - exec_started) * 1000,
            teardown_ms=(finished - exec_done) * 1000,
            cpu_ms=stage.cpu_ms,
            peak_memory_kb=stage.peak_memory_kb,
        )

    # --- instances ----------------------------------------------------------------------
    def _new_instance(
        self,
        module: LoadedModule,
        *,
        argv: list[str],
        limits: CallLimits,
        warm: bool,
        stdin_data: bytes | None = None,
    ) -> Instance:
        assert self._engine is not None
        host_dir = HostDir.create(self._run_dir, f"i{next(self._names)}")
        try:
            inst = Instance(
                self._engine,
                module,
                argv=argv,
                host_dir=host_dir,
                caps=self._caps,
                limits=limits,
                writable_workdir=self.config.writable_workdir,
                ready_marker=READY_MARKER if warm else None,
                stdin_data=stdin_data,
                on_dispose=self._untrack,
            )
        except BaseException:
            host_dir.remove()
            raise
        with self._lock:
            self._live.add(inst)
        return inst

    def _untrack(self, inst: Instance) -> None:
        with self._lock:
            self._live.discard(inst)

    @staticmethod
    def _join(instances: list[Instance], timeout: float) -> list[Instance]:
        deadline = time.monotonic() + timeout
        stuck = []
        for inst in instances:
            if not inst.join(max(0.0, deadline - time.monotonic())):
                stuck.append(inst)
        return stuck

    def _clean_stale_run_dirs(self) -> None:
        """Remove run dirs left by processes of this host that no longer exist."""
        root = self.config.resolved_run_dir
        if not root.is_dir():
            return
        for entry in root.iterdir():
            pid_text = entry.name.split("-", 1)[0]
            if not pid_text.isdigit() or int(pid_text) == os.getpid():
                continue
            try:
                os.kill(int(pid_text), 0)
            except ProcessLookupError:
                shutil.rmtree(entry, ignore_errors=True)
            except PermissionError:
                pass


async def _outputs_released(timeout: float) -> None:
    """Wait until wasmtime has dropped the stdout/stderr callbacks of closed stores.

    wasmtime drops a store's output streams on its own worker threads, a little after the
    store, and the drop calls back into Python. If the interpreter is exiting by then, that
    thread panics ("panic in a function that cannot unwind"), so ``close()`` lets them
    finish.
    """
    slab = getattr(wasmtime_wasi, "CUSTOM_OUTPUTS", None)
    handles = getattr(slab, "handles", None)
    if not isinstance(handles, dict):
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(isinstance(v, OutputCapture) for v in list(handles.values())):
            return
        await asyncio.sleep(0.01)
    log.warning("wasm: output callbacks of closed stores still alive after %ss", timeout)


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000
