"""``WasmExecutor``: runs wasm calls inside the worker process (``worker_main``).

Interpreter languages run on a warm instance from the shared warm-pool framework
(``node.pools.Pool`` with ``WasmWorkers``, one key per interpreter; one call each,
then discarded), except the pre-initialised Python component, which needs no
warming: each call instantiates it afresh. Raw modules get a fresh instance from their
``InstancePre``. All report through the same path: arm the limits, let the guest run,
wait for its outcome (with a host backstop past the deadline), map it to a
``StageResult``.

Modules arrive compiled (``ModuleLoader``): the executor never compiles. A raw module that
is not loaded makes ``run`` return None, and the node sends it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wasmtime import _wasi as wasmtime_wasi

from node.fncall.wasm import languages, results
from node.fncall.wasm.bootstrap import READY_MARKER
from node.fncall.wasm.config import MIB, WasmConfig
from node.fncall.wasm.engine import COMPONENT_CORE_INSTANCES, WasmEngine
from node.fncall.wasm.instance import CallLimits, Instance, Outcome, StoreCaps
from node.fncall.wasm.languages import INTERPRETERS, Interpreter
from node.fncall.wasm.modules import LoadedModule, ModuleLoader, ModuleLoadError
from node.fncall.wasm.output import OutputCapture, OutputPipes
from node.fncall.wasm.threads import GuestThreads
from node.fncall.wasm.workdir import HostDir, decode_files
from node.fncall.wasm.workers import WarmupError, WasmWorkers
from node.pools import IdleCapacity, Pool, PoolClosed, PoolError
from node.timeouts import fail_after
from node.workfiles import InvalidSpec
from wire.execution import RunResult, RunSpec, StageResult, StageStatus
from wire.messages import pool_key

log = logging.getLogger(__name__)

OUTPUT_RELEASE_TIMEOUT_S = 2.0
#: The FIFOs of fresh instances' output, under the run dir (instance dirs are ``i<n>``)
PIPES_DIR = "pipes"
#: Free output FIFOs kept to be lent again (two per fresh instance; two descriptors each)
PIPES_KEPT = 256
RUNTIME_NAME = "wasm"


class WasmExecutor:
    def __init__(self, config: WasmConfig, run_dir: Path) -> None:
        self.config = cfg = config
        self._caps = StoreCaps(
            table_elements=cfg.max_table_elements,
            instances=cfg.max_instances,
            tables=cfg.max_tables,
            memories=cfg.max_memories,
        )
        # The Python component is several core instances linked together; the pool's
        # per-component ceiling is the store's too (the caller's modules get max_instances)
        self._component_caps = dataclasses.replace(self._caps, instances=COMPONENT_CORE_INSTANCES)
        self._run_dir = run_dir
        self._names = itertools.count(1)
        self._engine = WasmEngine(cfg)
        self._engine.start()
        self._threads = GuestThreads()
        self._pipes: OutputPipes | None = None  #: fresh instances' output FIFOs, once made
        self._empty: HostDir | None = None  #: the shared empty work dir, once made
        self._loader = ModuleLoader(self._engine, memory_slots=cfg.module_memory_slots)
        self._pool: Pool[Instance] | None = None
        self._interpreters: dict[str, LoadedModule] = {}
        self._live: set[Instance] = set()
        self._busy: set[Instance] = set()
        #: instances answered as abandoned whose guest thread has not ended yet
        self._stuck: set[Instance] = set()
        self._lock = threading.Lock()
        self._closed = False

    def load_interpreter(self, language: str, sha256: str, compiled: bytes) -> None:
        """Map a compiled interpreter (raises ``InterpreterError``)."""
        loaded = self._loader.load_interpreter(
            language, sha256, compiled, component=INTERPRETERS[language].component
        )
        self._interpreters[language] = loaded
        log.info("wasm worker: %s loaded in %.0f ms", language, loaded.load_ms)

    def load_module(self, sha256: str, compiled: bytes) -> str | None:
        """Map a compiled raw module; the caller's error message if it cannot run."""
        try:
            self._loader.load_raw(sha256, compiled)
        except ModuleLoadError as exc:
            return str(exc)
        return None

    async def start(self) -> None:
        """Warm the pools (returns once each interpreter has its minimum, or failed)."""
        if self._closed:
            return
        self._pool = pool = self._make_pool()
        try:
            await pool.start()
        except PoolClosed:
            return
        except Exception as exc:  # the refill goes on trying, backing off
            log.warning("wasm worker: warming the pools failed: %s", exc)

    async def run(
        self, spec: RunSpec, *, invocation_id: str, module: str | None
    ) -> RunResult | None:
        """One call; None when the raw module ``module`` is not loaded here."""
        if self._closed:
            return RunResult(error="the wasm worker is closing")
        try:
            cfg = self.config
            if cfg.pooling and spec.limits.memory_mb > cfg.pool_max_memory_mb:
                raise InvalidSpec(
                    f"memory_mb {spec.limits.memory_mb} is above this node's wasm maximum "
                    f"of {cfg.pool_max_memory_mb} MB"
                )
            if spec.language in self._interpreters:
                return await self._run_interpreter(spec, invocation_id)
            if spec.language == languages.RAW_LANGUAGE and module is not None:
                loaded = self._loader.cached(module)
                if loaded is None:
                    return None
                return await self._run_module(spec, invocation_id, loaded)
        except InvalidSpec as exc:
            log.info("inv=%s rejected: %s", invocation_id, exc)
            return RunResult(run=StageResult(status=StageStatus.ERROR, message=str(exc)))
        return RunResult(error=f"the wasm worker does not offer language {spec.language!r}")

    def status(self) -> dict[str, Any]:
        """The pools' gauges and the idle capacity since the previous call."""
        pool = self._pool
        gauges = pool.stats() if pool is not None else {}
        idle: dict[str, IdleCapacity] = pool.idle_capacity() if pool is not None else {}
        with self._lock:
            stuck = len(self._stuck)
        return {
            "warm": gauges.get("warm", 0),
            "starting": gauges.get("starting", 0),
            "stuck": stuck,
            "inventory": pool.inventory() if pool is not None else {},
            "idle": {
                key: [cap.instance_seconds, cap.memory_mb_seconds, cap.starts, cap.cold_starts]
                for key, cap in idle.items()
            },
        }

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
        engine.interrupt_all()
        for inst in live:
            inst.dispose()
        stuck = await asyncio.to_thread(self._join, live, self.config.close_timeout_s)
        if stuck:
            log.error("wasm worker: %d instance threads did not stop: %s", len(stuck), stuck)
        busy = await asyncio.to_thread(self._threads.close, 0.0 if stuck else 1.0)
        if busy and not stuck:
            log.error("wasm worker: guest threads still running after close: %s", busy)
        if self._pipes is not None:
            self._pipes.close()
        await _outputs_released(OUTPUT_RELEASE_TIMEOUT_S)
        engine.close()
        self._interpreters.clear()
        shutil.rmtree(self._run_dir, ignore_errors=True)
        log.info("wasm worker: closed")

    # --- interpreters -------------------------------------------------------------------
    def _make_pool(self) -> Pool[Instance]:
        """One pool for every interpreter loaded, a key per interpreter."""
        makers = {
            pool_key(RUNTIME_NAME, name): (name, self._warm_maker(INTERPRETERS[name], loaded))
            for name, loaded in self._interpreters.items()
            if loaded.component is None
        }
        pool = Pool(WasmWorkers(makers), self.config.pool_config(), name=RUNTIME_NAME)
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
        call = functools.partial(
            self._call,
            spec=spec,
            files=files,
            invocation_id=invocation_id,
            started=started,
            oom_markers=interp.oom_markers,
        )
        loaded = self._interpreters[spec.language]
        if loaded.component is not None:  # a fresh instance of the snapshot
            return await call(
                self._new_instance(
                    loaded,
                    argv=interp.argv(self.config),
                    limits=self._limits(spec),
                    warm=False,
                    stdin_data=spec.stdin.encode("utf-8", "replace"),
                    source=spec.code,
                )
            )
        pool = self._pool
        if pool is None:
            return RunResult(error="the wasm runtime is not running")
        context = f"inv={invocation_id}"
        try:
            inst = await pool.acquire(pool_key(RUNTIME_NAME, spec.language), context=context)
        except (PoolError, WarmupError) as exc:
            log.error("inv=%s %s", invocation_id, exc)
            return RunResult(error=str(exc), setup_ms=_ms(started))
        try:
            return await call(inst, payload=interp.payload(spec.code, spec.stdin))
        finally:
            pool.release(inst, context=context)

    # --- raw modules --------------------------------------------------------------------
    async def _run_module(
        self, spec: RunSpec, invocation_id: str, loaded: LoadedModule
    ) -> RunResult:
        started = time.perf_counter()
        files = decode_files(spec, max_bytes=self.config.max_input_bytes)
        files.pop(languages.RAW_MODULE_FILE, None)
        inst = self._new_instance(
            loaded,
            argv=[languages.RAW_MODULE_FILE],
            limits=self._limits(spec),
            warm=False,
            stdin_data=spec.stdin.encode("utf-8", "replace"),
            needs_own_dir=bool(files or spec.fetch_files),
        )
        return await self._call(inst, spec, files, invocation_id, started=started)

    # --- one call -----------------------------------------------------------------------
    def _limits(self, spec: RunSpec) -> CallLimits:
        limits = spec.limits
        return CallLimits(
            memory_bytes=limits.memory_mb * MIB,
            timeout_s=limits.run_timeout_s,
            max_output=limits.max_output_bytes,
            fuel=self.config.fuel_per_call,
            cpu_basis=limits.time_basis == "cpu",
            wall_s=limits.wall_limit(limits.run_timeout_s),
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
            waiting = inst.outcome_future(asyncio.get_running_loop())
            timer = fail_after(limits.wall_limit_s + self.config.host_grace_s, waiting)
            try:
                outcome = await waiting
            except TimeoutError:
                with self._lock:
                    self._stuck.add(inst)
                    stuck = len(self._stuck)
                inst.on_done(self._unstick)
                log.error(
                    "inv=%s instance %s ignored its deadline; abandoned (%d stuck)",
                    invocation_id,
                    inst.id,
                    stuck,
                )
            finally:
                timer.cancel()
            if outcome is not None:  # the guest has returned: all it wrote is readable
                inst.stdout.collect()
                inst.stderr.collect()
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
            if not inst.done:
                inst.abort()
            inst.dispose()
        finished = time.perf_counter()
        log.debug(  # the node's metrics count calls; INFO would be a line per call
            "inv=%s %s %s (exit %s) in %.1f ms on %s",
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
        source: str | None = None,
        needs_own_dir: bool = True,
    ) -> Instance:
        """A warm instance, or a fresh one armed with ``limits``. A fresh one that does not
        ``need_own_dir`` (no files in or out) shares the read-only empty dir, unless this
        node's work dirs are writable."""
        empty = None if warm else self._fresh_dirs()
        pipes = None if warm else self._output_pipes()
        if empty is None or needs_own_dir or self.config.writable_workdir:
            host_dir = HostDir.create(self._run_dir, f"i{next(self._names)}")
        else:
            host_dir = empty
        try:
            inst = Instance(
                self._engine,
                module,
                argv=argv,
                host_dir=host_dir,
                caps=self._component_caps if module.component is not None else self._caps,
                limits=limits,
                writable_workdir=self.config.writable_workdir,
                ready_marker=READY_MARKER if warm else None,
                stdin_data=stdin_data,
                source=source,
                on_dispose=self._untrack,
                threads=self._threads,
                pipes=pipes,
            )
        except BaseException:
            host_dir.remove()
            raise
        with self._lock:
            self._live.add(inst)
        return inst

    def _fresh_dirs(self) -> HostDir:
        """The shared empty work dir (made once)."""
        if self._empty is None:
            self._empty = HostDir.shared_empty(self._run_dir)
        return self._empty

    def _output_pipes(self) -> OutputPipes:
        """The fresh instances' output FIFOs, in their dir beside the instances' (made once,
        on the event loop's thread, which drains them)."""
        if self._pipes is None:
            directory = self._run_dir / PIPES_DIR
            directory.mkdir(mode=0o700, exist_ok=True)
            self._pipes = OutputPipes(directory, asyncio.get_running_loop(), keep=PIPES_KEPT)
        return self._pipes

    def _unstick(self, inst: Instance) -> None:
        with self._lock:
            self._stuck.discard(inst)

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
