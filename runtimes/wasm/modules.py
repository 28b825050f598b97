"""Loading modules: interpreter files we trust and raw modules callers upload.

Either way a module is found by the SHA-256 of its bytes: first in memory, then in the
``.cwasm`` disk cache, else compiled (one compile at a time: it is CPU-bound, and the
node's cores belong to running calls). Every loaded module gets its ``InstancePre`` from
the engine's shared WASI linker once, which type-checks its imports; instantiating from it
per call costs about 0.1 ms.

A raw module that cannot be used (not wasm, imports we do not offer, no ``_start``) raises
``ModuleLoadError``: that is the caller's fault, reported as an ERROR stage. An interpreter
file that is missing or not the pinned build raises ``InterpreterError``: the platform's.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from wasmtime import FuncType, InstancePre, Module, WasmtimeError

from runtimes.wasm.cache import ModuleCache
from runtimes.wasm.engine import WasmEngine

log = logging.getLogger(__name__)

WASM_MAGIC = b"\0asm"
_MAX_ERROR_CHARS = 600


class ModuleLoadError(ValueError):
    """A raw module cannot be run here; the message is for the caller."""


class InterpreterError(RuntimeError):
    """An interpreter file is missing, corrupt or not loadable."""


@dataclass(frozen=True, eq=False)
class LoadedModule:
    name: str
    sha256: str
    module: Module
    pre: InstancePre
    cached: bool  #: came from the disk cache, not compiled
    load_ms: float


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + "..."


class ModuleLoader:
    def __init__(
        self, engine: WasmEngine, cache: ModuleCache, *, memory_slots: int, max_module_bytes: int
    ) -> None:
        self._engine = engine
        self._cache = cache
        self._slots = memory_slots
        self._max_module_bytes = max_module_bytes
        self._raw: OrderedDict[str, LoadedModule] = OrderedDict()
        self._raw_lock = threading.Lock()
        self._compile_lock = threading.Lock()

    # --- interpreters -------------------------------------------------------------------
    def load_file(self, name: str, path: Path, *, sha256: str) -> LoadedModule:
        """Load a pinned interpreter; its bytes must hash to ``sha256``."""
        started = time.perf_counter()
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InterpreterError(f"{name}: cannot read {path}: {exc}") from exc
        digest = hashlib.sha256(data).hexdigest()
        if digest != sha256:
            raise InterpreterError(
                f"{name}: {path} has SHA-256 {digest}, expected the pinned {sha256}"
            )
        try:
            loaded = self._load(name, data, digest, started)
        except (WasmtimeError, ModuleLoadError) as exc:
            raise InterpreterError(f"{name}: cannot load {path}: {_short(exc)}") from exc
        log.info(
            "wasm: %s ready in %.0f ms (%s)",
            name,
            loaded.load_ms,
            "from the .cwasm cache" if loaded.cached else "compiled",
        )
        return loaded

    # --- raw modules --------------------------------------------------------------------
    def load_bytes(self, data: bytes, *, name: str = "module.wasm") -> LoadedModule:
        """Load an untrusted command module (kept compiled in a small LRU)."""
        started = time.perf_counter()
        if len(data) > self._max_module_bytes:
            raise ModuleLoadError(
                f"{name} is {len(data)} bytes; the limit is {self._max_module_bytes}"
            )
        if not data.startswith(WASM_MAGIC):
            raise ModuleLoadError(f"{name} is not a WebAssembly binary (no \\0asm header)")
        digest = hashlib.sha256(data).hexdigest()
        hit = self.cached(digest)
        if hit is not None:
            return hit
        try:
            loaded = self._load(name, data, digest, started)
        except WasmtimeError as exc:
            raise ModuleLoadError(
                f"{name} is not a valid WebAssembly module: {_short(exc)}"
            ) from exc
        with self._raw_lock:
            self._raw[digest] = loaded
            while len(self._raw) > self._slots:
                self._raw.popitem(last=False)
        return loaded

    def cached(self, digest: str) -> LoadedModule | None:
        """The raw module with this SHA-256 if it is compiled in memory (cheap: no I/O)."""
        with self._raw_lock:
            hit = self._raw.get(digest)
            if hit is not None:
                self._raw.move_to_end(digest)
            return hit

    # --- shared -------------------------------------------------------------------------
    def _load(self, name: str, data: bytes, digest: str, started: float) -> LoadedModule:
        engine = self._engine.engine
        module = self._cache.load(engine, digest)
        cached = module is not None
        if module is None:
            with self._compile_lock:
                module = self._cache.load(engine, digest)  # another thread may have won
                cached = module is not None
                if module is None:
                    module = Module(engine, data)
        pre = self._prepare(name, module)
        if not cached:
            self._cache.store(module, digest)
        return LoadedModule(
            name=name,
            sha256=digest,
            module=module,
            pre=pre,
            cached=cached,
            load_ms=(time.perf_counter() - started) * 1000,
        )

    def _prepare(self, name: str, module: Module) -> InstancePre:
        start = [e for e in module.exports if e.name == "_start"]
        if not start or not isinstance(start[0].type, FuncType):
            raise ModuleLoadError(
                f"{name} exports no _start function (only WASI command modules can run)"
            )
        try:
            return self._engine.linker.instantiate_pre(module)
        except WasmtimeError as exc:
            raise ModuleLoadError(
                f"{name} imports something this runtime does not offer "
                f"(only wasi_snapshot_preview1): {_short(exc)}"
            ) from exc
