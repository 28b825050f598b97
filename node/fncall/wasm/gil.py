"""wasmtime's short C calls, made without letting go of the GIL.

ctypes releases the GIL around every call into a library loaded as a ``CDLL``, which is
how wasmtime-py loads libwasmtime. A fresh instance costs 26 such calls: 15 on the
worker's event loop thread (the Store, its WASI context, its limits) and 11 on its guest
thread (instantiating, finding ``_start`` and its type, the call, the memory's size,
deleting the Store). Most return in a microsecond or two, but with the loop thread and
the guest threads all wanting the GIL, each release hands it to another thread, and the
caller then sleeps until it gets it back: two context switches for a microsecond of work.
The executor alone at concurrency 32 made 52 context switches per call, and 26-30 with
these calls keeping the GIL (docs/benchmarks-history.md, "The GIL kept across wasmtime's
short calls").

``keep_gil_in_short_calls()`` rebinds the calls named in ``SHORT_CALLS`` to the same
symbols loaded through ``ctypes.PyDLL``, whose calls keep the GIL. wasmtime-py's wrappers
look their function up in ``wasmtime._bindings`` at each call, so the rebinding takes
effect for every caller. A call is listed only if it never runs guest code, never waits
for another thread or process and copies at most what the platform's own limits bound
(argv, the environment, stdin). Everything else keeps releasing the GIL; above all the
calls that run guest code (instantiating, which runs a start function, and calling an
export): a guest looping in one of them must not stop the event loop or the epoch ticker
that interrupts it. Deleting a Store also keeps releasing it: unmapping a large memory
can take milliseconds.

Opening the output files (``wasi_config_set_stdout_file``) is not listed: opening a
FIFO's write end waits for a reader, and although the worker always holds the read end,
that wait must never happen with the GIL held.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from wasmtime import _bindings, _ffi

#: The wasmtime C functions called per instance that return at once without guest code.
SHORT_CALLS: tuple[str, ...] = (
    # the Store and its limits (event loop thread)
    "wasmtime_store_new",
    "wasmtime_store_context",
    "wasmtime_store_limiter",
    "wasmtime_context_set_epoch_deadline",
    "wasmtime_context_set_fuel",
    "wasmtime_context_set_wasi",
    "wasmtime_engine_increment_epoch",
    # the WASI context: argv, environment, stdin bytes, the work dir
    "wasi_config_new",
    "wasi_config_set_argv",
    "wasi_config_set_env",
    "wasi_config_set_stdin_bytes",
    "wasi_config_preopen_dir",
    "wasm_byte_vec_new",
    # looking at an instance's exports (guest thread, before and after its run)
    "wasmtime_instance_export_get",
    "wasmtime_instance_export_nth",
    "wasmtime_func_type",
    "wasm_functype_params",
    "wasm_functype_results",
    "wasm_functype_delete",
    "wasmtime_memory_data_size",
)

#: Calls that may run guest code or take long: never to be listed above.
RELEASING_CALLS: tuple[str, ...] = (
    "wasmtime_instance_pre_instantiate",
    "wasmtime_linker_instantiate",
    "wasmtime_instance_new",
    "wasmtime_func_call",
    "wasmtime_store_delete",
    "wasi_config_set_stdout_file",
    "wasi_config_set_stderr_file",
    "wasi_config_set_stdin_file",
    "wasmtime_module_new",
    "wasmtime_module_deserialize",
)

_lock = threading.Lock()
_kept: dict[str, Any] = {}  #: name -> its GIL-holding ctypes function


def keep_gil_in_short_calls() -> None:
    """Rebind ``SHORT_CALLS`` to GIL-holding functions (idempotent, process-wide). Raises
    ``LookupError`` if this wasmtime-py has no binding of that name, so an upgrade that
    renames one fails here, not silently."""
    with _lock:
        if _kept:
            return
        library = ctypes.PyDLL(_ffi.dll._name)
        rebound: dict[str, Any] = {}
        for name in SHORT_CALLS:
            released = getattr(_bindings, f"_{name}", None)
            if released is None:
                raise LookupError(f"wasmtime-py has no binding {name}")
            held = getattr(library, name)
            held.restype = released.restype
            held.argtypes = released.argtypes
            rebound[name] = held
        for name, held in rebound.items():
            setattr(_bindings, f"_{name}", held)
        _kept.update(rebound)


def keeps_gil(name: str) -> bool:
    """Whether calls to the C function ``name`` keep the GIL now."""
    function = getattr(_bindings, f"_{name}", None)
    return function is not None and bool(function._flags_ & ctypes._FUNCFLAG_PYTHONAPI)  # type: ignore[attr-defined]
