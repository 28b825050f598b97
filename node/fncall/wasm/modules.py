"""Loading compiled modules in the worker: interpreters and raw modules, from ``.cwasm``.

The worker never compiles: it gets each module as the serialized native code a compile
jail produced (``node.fncall.wasm.compiler``), checked by the node's cache, over its pipe, and
maps it with ``Module.deserialize``. Every loaded module gets its ``InstancePre`` from the
engine's shared WASI linker once, which type-checks its imports; instantiating from it
per call costs about 0.1 ms.

A raw module that cannot be used (imports we do not offer, no ``_start``) raises
``ModuleLoadError``: that is the caller's fault, reported as an ERROR stage. An
interpreter that cannot be loaded raises ``InterpreterError``: the platform's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from wasmtime import FuncType, InstancePre, Module, WasmtimeError
from wasmtime.component import Component

from node.fncall.wasm.engine import WasmEngine

log = logging.getLogger(__name__)

_MAX_ERROR_CHARS = 600


class ModuleLoadError(ValueError):
    """A raw module cannot be run here; the message is for the caller."""


class InterpreterError(RuntimeError):
    """An interpreter file is missing, corrupt or not loadable."""


@dataclass(frozen=True, eq=False)
class LoadedModule:
    """A core module with its ``InstancePre``, or a component (``pre`` None)."""

    name: str
    sha256: str
    pre: InstancePre | None
    load_ms: float
    component: Component | None = None


def short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + "..."


class ModuleLoader:
    def __init__(self, engine: WasmEngine, *, memory_slots: int) -> None:
        self._engine = engine
        self._slots = memory_slots
        self._raw: OrderedDict[str, LoadedModule] = OrderedDict()
        self._lock = threading.Lock()

    def load_interpreter(
        self, name: str, sha256: str, compiled: bytes, *, component: bool = False
    ) -> LoadedModule:
        """Map a compiled interpreter (the node checked its hash)."""
        try:
            if component:
                return self._load_component(name, sha256, compiled)
            return self._load(name, sha256, compiled)
        except (WasmtimeError, ModuleLoadError) as exc:
            raise InterpreterError(f"{name}: cannot load: {short(exc)}") from exc

    def load_raw(self, sha256: str, compiled: bytes, *, name: str = "module.wasm") -> LoadedModule:
        """Map a compiled raw module and keep it in a small LRU."""
        try:
            loaded = self._load(name, sha256, compiled)
        except WasmtimeError as exc:
            raise ModuleLoadError(f"{name} cannot be loaded: {short(exc)}") from exc
        with self._lock:
            self._raw[sha256] = loaded
            while len(self._raw) > self._slots:
                self._raw.popitem(last=False)
        return loaded

    def cached(self, sha256: str) -> LoadedModule | None:
        """The raw module with this SHA-256 if it is loaded (cheap: no I/O)."""
        with self._lock:
            hit = self._raw.get(sha256)
            if hit is not None:
                self._raw.move_to_end(sha256)
            return hit

    def _load(self, name: str, sha256: str, compiled: bytes) -> LoadedModule:
        started = time.perf_counter()
        module = Module.deserialize(self._engine.engine, compiled)
        pre = self._prepare(name, module)
        return LoadedModule(
            name=name, sha256=sha256, pre=pre, load_ms=(time.perf_counter() - started) * 1000
        )

    def _load_component(self, name: str, sha256: str, compiled: bytes) -> LoadedModule:
        started = time.perf_counter()
        component = Component.deserialize(self._engine.engine, compiled)
        if component.get_export_index("run") is None:
            raise ModuleLoadError(f"{name} exports no run function")
        return LoadedModule(
            name=name,
            sha256=sha256,
            pre=None,
            load_ms=(time.perf_counter() - started) * 1000,
            component=component,
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
                f"(only wasi_snapshot_preview1): {short(exc)}"
            ) from exc
