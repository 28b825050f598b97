"""``WasmBackend``: the WebAssembly FnCall backend (``FnBackend``) as the node sees it.

No guest runs in the node process, and the node never compiles or even parses
WebAssembly. The runtime

* checks each interpreter file against its pinned SHA-256, finds its ``.cwasm`` in the
  checked cache (``cache``) or has a compile jail build it (``compiler``);
* runs a worker process in its own jail (``worker``, ``worker_main``) that holds the
  engine, the warm pools and every instance, hands it each call and returns its
  ``RunResult``; a worker that dies fails its running calls with ``RunResult.error`` and
  is replaced;
* compiles a raw module it has not seen in a compile jail under the call's
  ``compile_timeout_s`` (CPU, and the wall backstop) and ``compile_memory_mb``, reported as
  the ``compile`` stage and charged in ``cpu_ms`` and ``setup_ms``; a module compiled by
  several calls at once is compiled once.

``stats()``, ``inventory()`` and ``idle_capacity()`` come from the worker's status frames.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.artifacts import ArtifactUnavailable
from node.fncall.base import FnBackend
from node.fncall.nsjail.cgroups import CgroupMode, CgroupSetup, detect
from node.fncall.nsjail.config import NsjailConfig
from node.fncall.wasm import languages, pycomponent
from node.fncall.wasm.cache import ModuleCache
from node.fncall.wasm.compiler import Compiled, Compiler
from node.fncall.wasm.config import WasmConfig
from node.fncall.wasm.engine import fingerprint
from node.fncall.wasm.languages import INTERPRETERS
from node.fncall.wasm.modules import InterpreterError
from node.fncall.wasm.worker import WorkerDied, WorkerProcess
from node.pools import IdleCapacity
from wire.execution import LanguageInfo, RunResult, RunSpec, StageResult, StageStatus

log = logging.getLogger(__name__)

WASM_MAGIC = b"\0asm"
#: slack on top of a call's own limits before the node stops waiting for the worker
IPC_GRACE_S = 5.0
#: pause between two failed worker starts, doubling up to the max
RESTART_BACKOFF_S, MAX_RESTART_BACKOFF_S = 0.5, 10.0


@dataclass(frozen=True)
class InterpreterInfo:
    name: str
    sha256: str
    cached: bool  #: came from the disk cache, not compiled
    load_ms: float


class WasmBackend(FnBackend):
    name = "wasm"

    def __init__(self, config: WasmConfig | None = None) -> None:
        self.config = config or WasmConfig()
        self._paths = languages.available(self.config)
        self._raw = languages.raw_wanted(self.config)
        self._fingerprint = fingerprint(self.config)
        self._cgroups: CgroupSetup | None = None
        self._cache: ModuleCache | None = None
        self._compiler: Compiler | None = None
        self._compiled: dict[str, tuple[str, bytes]] = {}  #: language -> (sha, .cwasm)
        self._interpreters: dict[str, InterpreterInfo] = {}
        self._compiling: dict[str, asyncio.Future[Compiled]] = {}
        self._worker: WorkerProcess | None = None
        self._ready: asyncio.Future[WorkerProcess] | None = None
        self._replacing: asyncio.Task[None] | None = None
        self._retiring: asyncio.Task[None] | None = None
        self._busy = 0
        self._status: dict[str, Any] = {}
        self._idle: dict[str, IdleCapacity] = {}
        self._started = False
        self._closed = False

    @property
    def interpreters(self) -> dict[str, InterpreterInfo]:
        """The interpreters ``start()`` loaded, by language."""
        return dict(self._interpreters)

    @property
    def engine_fingerprint(self) -> str | None:
        """Names the engine configuration (and so the cache directory); None before start."""
        return self._fingerprint if self._started else None

    @property
    def worker(self) -> WorkerProcess | None:
        """The current worker process (for diagnostics and tests)."""
        return self._worker

    # --- FnBackend protocol ---------------------------------------------------------------
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
        self._cgroups = cgroups = detect(
            NsjailConfig(cgroups=cfg.cgroups, cgroup_parent=cfg.cgroup_parent)
        )
        if cgroups.mode is CgroupMode.OFF and cfg.require_cgroups:
            raise RuntimeError("wasm: no cgroup hierarchy can limit the worker")
        cgroups.ensure_parents()
        self._cache = ModuleCache(
            cfg.resolved_cache_dir, self._fingerprint, max_bytes=cfg.cache_max_bytes
        )
        await asyncio.to_thread(self._cache.open)
        self._compiler = Compiler(cfg, cgroups)
        for name, path in list(self._paths.items()):
            try:
                await self._load_interpreter(name, path)
            except InterpreterError:
                if cfg.strict_interpreters:
                    raise
                log.warning("wasm: dropping %s", name, exc_info=True)
                del self._paths[name]
        if self._closed:
            return
        self._started = True
        self._ready = asyncio.get_running_loop().create_future()
        await self._replace_worker()
        log.info("wasm: started with %s", [lang.name for lang in self.languages()])

    async def run(self, spec: RunSpec, *, tenant_id: str, invocation_id: str) -> RunResult:
        if not self._started or self._closed:
            return RunResult(error="the wasm runtime is not running")
        raw = spec.language == languages.RAW_LANGUAGE and self._raw
        if spec.language not in self._interpreters and not raw:
            return RunResult(error=f"the wasm runtime does not offer language {spec.language!r}")
        started = time.perf_counter()
        self._busy += 1
        try:
            if raw:
                result = await self._run_module(spec, tenant_id, invocation_id)
            else:
                result = await self._call(spec, invocation_id, None) or RunResult(
                    error="the wasm worker asked for a module it was not given"
                )
        finally:
            self._busy -= 1
        elapsed = (time.perf_counter() - started) * 1000
        # the pipe and the compile are the setup of the call as the node sees it
        result.setup_ms += max(0.0, elapsed - result.setup_ms - result.exec_ms - result.teardown_ms)
        return result

    def stats(self) -> dict[str, int]:
        """Warm and starting instances of the worker's pools; busy: calls in flight."""
        return {
            "warm": int(self._status.get("warm", 0)),
            "busy": self._busy,
            "starting": int(self._status.get("starting", 0)),
        }

    def inventory(self) -> dict[str, int]:
        inventory = self._status.get("inventory") or {}
        return {str(k): int(v) for k, v in inventory.items()}

    def idle_capacity(self) -> dict[str, IdleCapacity]:
        taken, self._idle = self._idle, {}
        return taken

    async def close(self) -> None:
        """Close the worker (its running calls end KILLED). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in (self._replacing, self._retiring):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        worker, self._worker = self._worker, None
        if worker is not None:
            await worker.close(self.config.close_timeout_s + IPC_GRACE_S)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(WorkerDied("the wasm runtime is closed"))
            self._ready.exception()  # retrieved: nobody may be waiting
        self._status, self._idle = {}, {}
        log.info("wasm: closed")

    # --- interpreters -------------------------------------------------------------------
    async def _load_interpreter(self, name: str, path: Path) -> None:
        assert self._cache is not None and self._compiler is not None
        started = time.perf_counter()
        interp = INTERPRETERS[name]
        expected, source = interp.sha256, "pinned"
        if expected is None:  # built here: by an earlier start, setup-wasm.sh, or now
            expected, source = await self._built_sha256(name, path), "built"
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except OSError as exc:
            raise InterpreterError(f"{name}: cannot read {path}: {exc}") from exc
        digest = hashlib.sha256(data).hexdigest()
        if digest != expected:
            raise InterpreterError(
                f"{name}: {path} has SHA-256 {digest}, expected the {source} {expected}"
            )
        cfg = self.config
        cwasm = await asyncio.to_thread(
            self._cache.load, "interpreters", digest, max_bytes=cfg.max_compiled_bytes
        )
        cached = cwasm is not None
        if cwasm is None:
            compiled = await self._compiler.compile(
                data,
                cpu_s=cfg.interpreter_compile_timeout_s,
                wall_s=cfg.interpreter_compile_timeout_s,
                memory_mb=cfg.interpreter_compile_memory_mb,
                parallel=cfg.parallel_compilation,
            )
            if compiled.cwasm is None:
                raise InterpreterError(f"{name}: cannot compile {path}: {compiled.stage.message}")
            cwasm = compiled.cwasm
            await asyncio.to_thread(self._cache.store, "interpreters", digest, cwasm)
        self._compiled[name] = (digest, cwasm)
        info = InterpreterInfo(name, digest, cached, (time.perf_counter() - started) * 1000)
        self._interpreters[name] = info
        log.info(
            "wasm: %s ready in %.0f ms (%s)",
            name,
            info.load_ms,
            "from the .cwasm cache" if cached else "compiled in a compile jail",
        )

    async def _built_sha256(self, name: str, path: Path) -> str:
        """The SHA-256 of the Python component in ``path``'s dir, building it first when
        it is missing or was built from other sources."""
        directory = path.parent
        built = await asyncio.to_thread(pycomponent.current, directory)
        if built is None:
            log.info("wasm: building %s (componentize-py, ~10 s)", name)
            try:
                built = await asyncio.to_thread(
                    pycomponent.build, directory, timeout_s=self.config.component_build_timeout_s
                )
            except (pycomponent.BuildError, OSError) as exc:
                raise InterpreterError(f"{name}: cannot build {path}: {exc}") from exc
        return built.sha256

    # --- the worker ---------------------------------------------------------------------
    async def _replace_worker(self) -> None:
        """Start a worker (until one starts, backing off) and make it the current one."""
        assert self._cgroups is not None
        delay = RESTART_BACKOFF_S
        while not self._closed:
            worker = self._new_worker(self._cgroups)
            try:
                status = await asyncio.wait_for(
                    worker.start(self._compiled), self.config.worker_start_timeout_s
                )
            except (WorkerDied, TimeoutError, OSError) as exc:
                log.error("wasm: a worker failed to start: %s", exc)
                worker.kill()
                await worker.close(1.0)
                await asyncio.sleep(delay)
                delay = min(MAX_RESTART_BACKOFF_S, delay * 2)
                continue
            self._worker = worker
            self._on_status(status, worker)
            assert worker.died is not None
            worker.died.add_done_callback(functools.partial(self._on_worker_died, worker))
            if self._ready is None or self._ready.done():  # replacing a retired worker
                self._ready = asyncio.get_running_loop().create_future()
            self._ready.set_result(worker)
            log.info("wasm: worker %s ready", worker.guest_host_pid())
            return

    def _new_worker(self, cgroups: CgroupSetup) -> WorkerProcess:
        worker: WorkerProcess

        def on_status(msg: dict[str, Any]) -> None:
            self._on_status(msg, worker)

        worker = WorkerProcess(self.config, cgroups, on_status=on_status)
        return worker

    async def _retire(self, old: WorkerProcess, stuck: int) -> None:
        """Replace ``old``, whose abandoned guests are blocked in host calls: new calls go
        to a new worker at once; ``old`` is closed (its stuck threads with it) once its
        running calls are answered, or after ``retire_drain_s``."""
        log.warning(
            "wasm: worker %s holds %d abandoned instances; replacing it",
            old.guest_host_pid(),
            stuck,
        )
        try:
            await self._replace_worker()
            if not await old.drain(self.config.retire_drain_s):
                log.error("wasm: the replaced worker's calls did not end; closing it anyway")
            await old.close(self.config.close_timeout_s + IPC_GRACE_S)
        finally:
            old.kill()  # no-op once closed; cancelled before (the runtime closing): ended here
            self._retiring = None

    def _on_worker_died(self, worker: WorkerProcess, died: asyncio.Future[str]) -> None:
        if self._closed or worker is not self._worker:
            return  # closing, or a worker retired on purpose
        log.error("wasm: %s; starting another", died.result())
        self._ready = asyncio.get_running_loop().create_future()
        self._status = {}
        self._replacing = asyncio.create_task(self._replace_worker(), name="wasm-worker-restart")

    async def _current_worker(self) -> WorkerProcess:
        ready = self._ready
        if ready is None:
            raise WorkerDied("the wasm runtime is not running")
        if ready.done() and not ready.cancelled() and ready.exception() is None:
            return ready.result()  # the usual case: no timer, no shield
        return await asyncio.wait_for(asyncio.shield(ready), self.config.worker_start_timeout_s)

    def _on_status(self, msg: dict[str, Any], worker: WorkerProcess) -> None:
        """A worker's status. Its idle capacity is this node's whichever worker reports it
        (each status hands over what accrued since the last, so one dropped is lost): the
        worker that is starting (its warm starts may be reported before it is current)
        and one being replaced count as the current one does. Only the current worker's
        gauges and stuck instances are the runtime's."""
        for key, values in (msg.get("idle") or {}).items():
            seconds, mb_seconds, starts, cold = values
            cap = self._idle.setdefault(str(key), IdleCapacity())
            cap += IdleCapacity(float(seconds), float(mb_seconds), int(starts), int(cold))
        if worker is not self._worker:
            return
        stuck = int(msg.get("stuck") or 0)
        if stuck >= self.config.max_stuck_instances and self._retiring is None and not self._closed:
            self._retiring = asyncio.get_running_loop().create_task(
                self._retire(worker, stuck), name="wasm-worker-retire"
            )
        self._status = {k: msg.get(k) for k in ("warm", "starting", "inventory")}

    # --- calls --------------------------------------------------------------------------
    async def _call(
        self, spec: RunSpec, invocation_id: str, module: str | None
    ) -> RunResult | None:
        """Hand one call to the worker; None when it needs the raw module ``module``."""
        try:
            worker = await self._current_worker()
            limits = spec.limits
            timeout = limits.wall_limit(limits.run_timeout_s) + self.config.host_grace_s
            reply = await worker.request(
                {
                    "op": "run",
                    "spec": spec.model_dump(mode="json"),
                    "inv": invocation_id,
                    "module": module,
                },
                timeout=timeout + self.config.warmup_timeout_s + IPC_GRACE_S,
            )
        except WorkerDied as exc:
            log.error("inv=%s wasm worker lost: %s", invocation_id, exc)
            return RunResult(error=f"the wasm worker failed: {exc}")
        except TimeoutError:
            log.error("inv=%s the wasm worker did not answer; replacing it", invocation_id)
            worker.kill()
            return RunResult(error="the wasm worker did not answer in time; it was replaced")
        if "need" in reply:
            return None
        if "failure" in reply:
            log.error("inv=%s wasm worker failure: %s", invocation_id, reply["failure"])
            return RunResult(error=f"the wasm worker failed: {reply['failure']}")
        if isinstance(reply.get("status"), dict):
            self._on_status(reply["status"], worker)
        return RunResult.model_validate(reply["result"])

    async def _run_module(self, spec: RunSpec, tenant_id: str, invocation_id: str) -> RunResult:
        """A raw module: by digest (a tool function's ``spec.artifact``: its bytes are
        fetched only if the worker lacks the module) or in ``files["module.wasm"]``."""
        started = time.perf_counter()
        data: bytes | None = None
        if spec.artifact is not None:
            digest, slim = spec.artifact, spec
        else:
            encoded = spec.files.get(languages.RAW_MODULE_FILE)
            if encoded is None:
                return _error_stage(
                    f"language {languages.RAW_LANGUAGE!r} needs the module as base64 in "
                    f"files[{languages.RAW_MODULE_FILE!r}]"
                )
            try:
                data = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError) as exc:
                return _error_stage(
                    f"file {languages.RAW_MODULE_FILE!r} is not valid base64: {exc}"
                )
            digest = hashlib.sha256(data).hexdigest()
            files = {k: v for k, v in spec.files.items() if k != languages.RAW_MODULE_FILE}
            slim = spec.model_copy(update={"files": files})
        first = await self._call(slim, invocation_id, digest)
        if first is not None:
            return first
        if data is None:
            if self.artifacts is None:
                return RunResult(error="this node has no source of function artifacts")
            try:
                data = await self.artifacts.get(tenant_id, digest)
            except ArtifactUnavailable as exc:
                log.error("inv=%s %s", invocation_id, exc)
                return RunResult(error=str(exc))
        limit = self.config.max_module_bytes
        if len(data) > limit:
            return _error_stage(f"module.wasm is {len(data)} bytes; the limit is {limit}")
        if not data.startswith(WASM_MAGIC):
            return _error_stage("module.wasm is not a WebAssembly binary (no \\0asm header)")
        compile_stage, error = await self._send_module(data, digest, spec, invocation_id)
        if error is not None:
            error.compile = compile_stage
            _charge(error, compile_stage)
            return error
        result = await self._call(slim, invocation_id, digest) or RunResult(
            error="the wasm worker dropped the module before running it"
        )
        result.compile = compile_stage
        _charge(result, compile_stage)
        log.debug("inv=%s module %s in %.1f ms", invocation_id, digest[:12], _ms(started))
        return result

    async def _send_module(
        self, data: bytes, digest: str, spec: RunSpec, invocation_id: str
    ) -> tuple[StageResult | None, RunResult | None]:
        """Get the module's ``.cwasm`` (cache or compile jail) into the worker: the compile
        stage (None if nothing was compiled for this call) and, on failure, the result."""
        assert self._cache is not None
        cfg = self.config
        cwasm = await asyncio.to_thread(
            self._cache.load, "modules", digest, max_bytes=cfg.max_compiled_bytes
        )
        stage: StageResult | None = None
        if cwasm is None:
            compiled = await self._compile(data, digest, spec)
            stage = compiled.stage
            if compiled.cwasm is None:
                log.info("inv=%s module %s: %s", invocation_id, digest[:12], stage.message)
                if compiled.invalid is not None:
                    return stage, _error_stage(compiled.invalid)
                return stage, RunResult()
            cwasm = compiled.cwasm
        try:
            worker = await self._current_worker()
            reply = await worker.request(
                {"op": "load", "sha256": digest, "name": languages.RAW_MODULE_FILE},
                cwasm,
                timeout=cfg.warmup_timeout_s + IPC_GRACE_S,
            )
        except (WorkerDied, TimeoutError) as exc:
            return stage, RunResult(error=f"the wasm worker failed: {exc}")
        if reply.get("error"):
            log.info("inv=%s module refused: %s", invocation_id, reply["error"])
            return stage, _error_stage(str(reply["error"]))
        if reply.get("failure"):
            return stage, RunResult(error=f"the wasm worker failed: {reply['failure']}")
        return stage, None

    async def _compile(self, data: bytes, digest: str, spec: RunSpec) -> Compiled:
        """Compile in a jail under the call's compile limits; a module already being
        compiled is waited for (and compiled again if that compile hit its limits)."""
        assert self._compiler is not None and self._cache is not None
        running = self._compiling.get(digest)
        if running is not None:
            shared = await asyncio.shield(running)
            if shared.cwasm is not None or shared.invalid is not None:
                wait = StageResult(status=StageStatus.FINISHED, exit_code=0, cpu_ms=0.0)
                return Compiled(shared.cwasm, wait, shared.invalid)
        future: asyncio.Future[Compiled] = asyncio.get_running_loop().create_future()
        self._compiling[digest] = future
        try:
            limits = spec.limits
            compiled = await self._compiler.compile(
                data,
                cpu_s=limits.compile_timeout_s,
                wall_s=limits.wall_limit(limits.compile_timeout_s),
                memory_mb=limits.compile_memory_mb,
                parallel=False,
            )
            if compiled.cwasm is not None:
                await asyncio.to_thread(self._cache.store, "modules", digest, compiled.cwasm)
            future.set_result(compiled)
            return compiled
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()
            raise
        finally:
            if self._compiling.get(digest) is future:
                del self._compiling[digest]


def _error_stage(message: str) -> RunResult:
    """The caller's module cannot run: an ERROR run stage (not a platform error)."""
    return RunResult(run=StageResult(status=StageStatus.ERROR, message=message))


def _charge(result: RunResult, stage: StageResult | None) -> None:
    """Count a compile's wall time in ``setup_ms`` and its CPU in ``cpu_ms``."""
    if stage is None:
        return
    result.setup_ms += stage.wall_ms
    if stage.cpu_ms is not None:
        result.cpu_ms = (result.cpu_ms or 0.0) + stage.cpu_ms


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000
