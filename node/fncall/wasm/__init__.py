"""The WebAssembly FnCall backend: wasmtime instances, one per call, from warm pools,
all inside a jailed worker process; nothing of wasm runs or is compiled in the node.

Importing this package registers the backend as ``"wasm"``. Modules, one concept each:

In the node:

* ``config``       tunables (``WasmConfig``) and their derivation from ``NodeSettings``
* ``backend``      ``WasmBackend``, the ``FnBackend`` implementation: a client of the worker
* ``worker``       ``WorkerProcess``: starting the worker, requests and replies, its death
* ``compiler``     compiling one module in a fresh, limited compile jail
* ``cache``        ``.cwasm`` entries on disk: ownership checks, HMAC, LRU of raw modules
* ``jail``         the nsjail command line of the worker and the compile jails
* ``seccomp``      their seccomp allowlist, and the worker's own no-exec filter
* ``languages``    the languages offered and where their interpreters come from
* ``protocol``     the bounded JSON frames between node and worker (both sides)

In the worker (``worker_main``) and the compile jails (``compile_main``):

* ``executor``     ``WasmExecutor``: the pools, instances and calls of the worker
* ``engine``       the wasmtime Engine of a configuration, its WASI linker, the epoch ticker
* ``epoch``        the per-store epoch callback that enforces a CPU-time limit
* ``hostcalls``    our ``poll_oneoff``/``clock_time_get``: sleeps bounded by the deadline
* ``modules``      mapping compiled modules and their ``InstancePre``
* ``bootstrap``    the warm interpreters' start-up programs and the stdin frame
* ``workdir``      an instance's dir, spec files in, fetched files out
* ``stdin``        the FIFO a warm instance waits on and its non-blocking feeder
* ``output``       bounded stdout/stderr capture
* ``instance``     one Store + instance + guest thread, used for one call
* ``workers``      warm instances as one-shot workers of the shared pool (``node.pools``)
* ``results``      mapping an instance's outcome to a ``StageResult``

See docs/wasm.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from node.fncall import registry
from node.fncall.base import FnBackend
from node.fncall.wasm.backend import WasmBackend
from node.fncall.wasm.config import WasmConfig

if TYPE_CHECKING:
    from node.settings import NodeSettings

__all__ = ["WasmBackend", "WasmConfig"]


def _factory(settings: NodeSettings) -> FnBackend:
    return WasmBackend(WasmConfig.from_settings(settings))


registry.register(WasmBackend.name, _factory)
