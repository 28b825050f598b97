"""One wasmtime ``Engine`` per configuration, its linkers and its epoch ticker.

Time limits are epoch deadlines: a ticker thread increments the engine's epoch every
``epoch_tick_ms`` and each store traps with ``TrapCode.INTERRUPT`` once the epoch passes
its deadline. The ticker must stop before the engine is dropped (a ticker still running at
interpreter exit makes wasmtime panic), so ``close()`` stops and joins it, and an
``atexit`` hook stops any ticker a caller forgot.

The fingerprint names everything that makes a compiled ``.cwasm`` incompatible with another
engine (wasmtime version, host architecture, the Config knobs set here), so the module
cache keeps one directory per fingerprint.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.metadata
import json
import logging
import math
import platform
import threading
import time
import weakref

from wasmtime import Config, Engine, Linker
from wasmtime import _ffi as ffi
from wasmtime.component import Linker as ComponentLinker

from node.fncall.wasm import gil, hostcalls
from node.fncall.wasm.config import MIB, WasmConfig

log = logging.getLogger(__name__)

_LIVE: weakref.WeakSet[WasmEngine] = weakref.WeakSet()


def _knobs(config: WasmConfig) -> dict[str, object]:
    """The Config settings that change compiled code (``parallel_compilation`` does not;
    the allocator is named too, so that a ``.cwasm`` is only loaded where it was made)."""
    return {
        "epoch_interruption": True,
        "consume_fuel": config.fuel_per_call is not None,
        "opt_level": config.opt_level,
        "max_wasm_stack": config.max_wasm_stack_bytes,
        "wasm_threads": False,
        "pooling": config.pooling,
    }


def engine_config(config: WasmConfig, *, parallel: bool) -> Config:
    """A wasmtime ``Config`` for ``config``: the same in the worker that runs modules and
    in the compile jail that compiles them (their ``.cwasm`` must match). The threads
    proposal is off: a module declaring shared memory or atomics is refused."""
    knobs = _knobs(config)
    cfg = Config()
    cfg.epoch_interruption = True
    cfg.consume_fuel = bool(knobs["consume_fuel"])
    cfg.cranelift_opt_level = config.opt_level
    cfg.max_wasm_stack = config.max_wasm_stack_bytes
    cfg.wasm_threads = False
    cfg.shared_memory = False
    cfg.parallel_compilation = parallel
    if config.pooling:
        _use_pooling(cfg, config)
    return cfg


#: Core instances, tables and memories one component may hold, and a component's own
#: state (the Python component of componentize-py 0.25.1 failed to instantiate under 8
#: core instances and ran under 16; it has 1 memory and 2 tables).
COMPONENT_CORE_INSTANCES = 16
COMPONENT_TABLES = 4
COMPONENT_MEMORIES = 1
INSTANCE_STATE_BYTES = 1 * MIB


def _use_pooling(cfg: Config, config: WasmConfig) -> None:
    """wasmtime's pooling allocator, through wasmtime-py's C bindings (its Python API has
    no wrapper for it). Without it every instance maps its memory and unmaps it at the
    end, and a first write to each page of a snapshot is a fault: threads of one process
    doing that at once serialise on the kernel's lock of the address space (measured:
    two concurrent Python calls cost twice the CPU of one). With it a slot is reserved
    once, reused, and its first ``pool_keep_resident_mb`` stay resident and are reset in
    place when the instance ends."""
    pool = ffi.wasmtime_pooling_allocation_config_new()
    try:
        slots = config.pool_slots
        ffi.wasmtime_pooling_allocation_config_max_memory_size_set(
            pool, config.pool_max_memory_mb * MIB
        )
        ffi.wasmtime_pooling_allocation_config_linear_memory_keep_resident_set(
            pool, config.pool_keep_resident_mb * MIB
        )
        ffi.wasmtime_pooling_allocation_config_max_unused_warm_slots_set(
            pool, min(config.pool_max_unused_warm_slots, slots)
        )
        ffi.wasmtime_pooling_allocation_config_total_memories_set(pool, slots)
        ffi.wasmtime_pooling_allocation_config_total_tables_set(
            pool, slots * max(COMPONENT_TABLES, config.max_tables)
        )
        ffi.wasmtime_pooling_allocation_config_total_core_instances_set(
            pool, slots * COMPONENT_CORE_INSTANCES
        )
        ffi.wasmtime_pooling_allocation_config_total_component_instances_set(pool, slots)
        ffi.wasmtime_pooling_allocation_config_max_core_instances_per_component_set(
            pool, COMPONENT_CORE_INSTANCES
        )
        ffi.wasmtime_pooling_allocation_config_max_memories_per_component_set(
            pool, COMPONENT_MEMORIES
        )
        ffi.wasmtime_pooling_allocation_config_max_tables_per_component_set(pool, COMPONENT_TABLES)
        ffi.wasmtime_pooling_allocation_config_max_memories_per_module_set(
            pool, config.max_memories
        )
        ffi.wasmtime_pooling_allocation_config_max_tables_per_module_set(pool, config.max_tables)
        ffi.wasmtime_pooling_allocation_config_table_elements_set(pool, config.max_table_elements)
        ffi.wasmtime_pooling_allocation_config_max_core_instance_size_set(
            pool, INSTANCE_STATE_BYTES
        )
        ffi.wasmtime_pooling_allocation_config_max_component_instance_size_set(
            pool, INSTANCE_STATE_BYTES
        )
        ffi.wasmtime_pooling_allocation_strategy_set(cfg.ptr(), pool)
    finally:
        ffi.wasmtime_pooling_allocation_config_delete(pool)


def fingerprint(config: WasmConfig) -> str:
    """Names everything that makes a ``.cwasm`` incompatible with another engine."""
    identity = {
        "wasmtime": importlib.metadata.version("wasmtime"),
        "machine": platform.machine(),
        **_knobs(config),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


class WasmEngine:
    """The engine, the shared WASI linker and the epoch ticker of one configuration."""

    def __init__(self, config: WasmConfig) -> None:
        gil.keep_gil_in_short_calls()  # process-wide, idempotent
        self.tick_s = config.epoch_tick_ms / 1000.0
        self.engine = Engine(engine_config(config, parallel=False))
        self.fuel_per_call = config.fuel_per_call
        self.fingerprint = fingerprint(config)
        self.linker = Linker(self.engine)
        self.linker.define_wasi()
        hostcalls.install(self.linker)
        #: WASI 0.2 and the Python component's ``sleep`` (``node.fncall.wasm.pycomponent``)
        self.component_linker = ComponentLinker(self.engine)
        self.component_linker.add_wasip2()
        hostcalls.install_component(self.component_linker)
        self._max_ticks = 1
        self._epoch = 0
        self._ticks_lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        _LIVE.add(self)

    def start(self) -> None:
        if self._ticker is not None:
            return
        self._stop.clear()
        self._ticker = threading.Thread(target=self._tick, name="wasm-epoch-ticker", daemon=True)
        self._ticker.start()

    @property
    def epoch(self) -> int:
        """The engine's epoch as far as this object has advanced it (it is the only one)."""
        return self._epoch

    def _advance(self, ticks: int) -> None:
        with self._ticks_lock:
            for _ in range(ticks):
                self.engine.increment_epoch()
            self._epoch += ticks

    def _tick(self) -> None:
        """Advance one tick per period of wall time, catching up after a late wake-up, so
        ``n`` ticks of deadline are ``n`` periods however loaded the host is."""
        started = time.monotonic()
        done = 0
        while True:
            due = int((time.monotonic() - started) / self.tick_s)
            if due > done:
                self._advance(due - done)
                done = due
            if self._stop.wait(started + (done + 1) * self.tick_s - time.monotonic()):
                return

    def ticks_for(self, seconds: float) -> int:
        """Epoch ticks covering ``seconds``; remembers the largest for ``interrupt_all``."""
        ticks = max(1, math.ceil(seconds / self.tick_s))
        with self._ticks_lock:
            self._max_ticks = max(self._max_ticks, ticks)
        return ticks

    def interrupt_all(self) -> None:
        """Push the epoch past every deadline ever set: all running wasm traps at once."""
        self._advance(self._max_ticks + 1)

    def close(self) -> None:
        """Stop and join the ticker. Idempotent."""
        self._stop.set()
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.join()
        _LIVE.discard(self)


@atexit.register
def _stop_tickers() -> None:
    for engine in list(_LIVE):
        engine.close()
