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
from wasmtime.component import Linker as ComponentLinker

from runtimes.wasm import hostcalls
from runtimes.wasm.config import WasmConfig

log = logging.getLogger(__name__)

_LIVE: weakref.WeakSet[WasmEngine] = weakref.WeakSet()


def _knobs(config: WasmConfig) -> dict[str, object]:
    """The Config settings that change compiled code (``parallel_compilation`` does not)."""
    return {
        "epoch_interruption": True,
        "consume_fuel": config.fuel_per_call is not None,
        "opt_level": config.opt_level,
        "max_wasm_stack": config.max_wasm_stack_bytes,
        "wasm_threads": False,
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
    return cfg


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
        self.tick_s = config.epoch_tick_ms / 1000.0
        self.engine = Engine(engine_config(config, parallel=False))
        self.fuel_per_call = config.fuel_per_call
        self.fingerprint = fingerprint(config)
        self.linker = Linker(self.engine)
        self.linker.define_wasi()
        hostcalls.install(self.linker)
        #: WASI 0.2 and the Python component's ``sleep`` (``runtimes.wasm.pycomponent``)
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
