"""A per-store epoch-deadline callback: how a CPU-time limit is enforced.

wasmtime checks the engine's epoch at function entries and loop back-edges; with a
callback installed, a store whose deadline is reached calls it instead of trapping. We
set the deadline one tick ahead and let the callback decide on the guest's own thread:
``check()`` returns the name of a limit that was reached (the store then traps with a
``WasmtimeError`` naming it) or None (the deadline moves one tick on). Ticks spent in
host calls (sleeps, a blocking read) never reach the callback, so it sees only time the
guest spends running wasm, and it measures CPU with the guest thread's own clock.

wasmtime-py 50 does not wrap this C API, so this module calls
``wasmtime_store_epoch_deadline_callback`` through its ctypes bindings; the wasmtime pin
protects it. The callback never raises (an exception in a ctypes callback is printed and
the call returns 0, which means "continue").
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from typing import Any

from wasmtime import Store
from wasmtime import _bindings as ffi

log = logging.getLogger(__name__)

_SETTER = ffi._wasmtime_store_epoch_deadline_callback
_CALLBACK_TYPE = _SETTER.argtypes[1]
_FINALIZER_TYPE = _SETTER.argtypes[3]
_CONTINUE = 0  # WASMTIME_UPDATE_DEADLINE_CONTINUE


def install(store: Store, check: Callable[[], str | None]) -> Any:
    """Make ``store`` call ``check`` at each epoch tick; returns the ctypes callback,
    which the caller must keep alive as long as the store."""

    def on_deadline(_ctx: Any, _data: Any, delta: Any, kind: Any) -> int:
        try:
            reached = check()
        except Exception:
            log.exception("wasm epoch callback failed")
            reached = None
        if reached is not None:
            error = ffi.wasmtime_error_new(f"corral: {reached} time limit reached".encode())
            return ctypes.cast(error, ctypes.c_void_p).value or 0
        delta[0] = 1
        kind[0] = _CONTINUE
        return 0

    callback = _CALLBACK_TYPE(on_deadline)
    no_finalizer = _FINALIZER_TYPE()  # a NULL function pointer
    _SETTER(store.ptr(), callback, None, no_finalizer)
    return callback
