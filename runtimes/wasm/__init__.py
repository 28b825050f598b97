"""The WebAssembly FnCall backend: wasmtime instances, one per call, from warm pools.

Importing this package registers the backend as ``"wasm"``. Modules, one concept each:

* ``config``     tunables (``WasmConfig``) and their derivation from ``NodeSettings``
* ``engine``     the wasmtime Engine of a configuration, its WASI linker, the epoch ticker
* ``hostcalls``  our ``poll_oneoff``/``clock_time_get``: sleeps bounded by the deadline
* ``cache``      compiled ``.cwasm`` files per engine fingerprint and module hash
* ``modules``    loading interpreters (pinned SHA-256) and raw modules into ``InstancePre``
* ``bootstrap``  the warm interpreters' start-up programs and the stdin frame
* ``languages``  the languages offered and where their interpreters come from
* ``workdir``    an instance's host dir, spec files in, fetched files out
* ``stdin``      the FIFO a warm instance waits on and its non-blocking feeder
* ``output``     bounded stdout/stderr capture
* ``instance``   one Store + instance + guest thread, used for one call
* ``workers``    warm instances as one-shot workers of the shared pool (``runtimes.pools``)
* ``results``    mapping an instance's outcome to a ``StageResult``
* ``runtime``    ``WasmRuntime``, the ``Runtime`` implementation

See docs/wasm.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtimes import registry
from runtimes.base import Runtime
from runtimes.wasm.config import WasmConfig
from runtimes.wasm.runtime import WasmRuntime

if TYPE_CHECKING:
    from runtimes.node.settings import NodeSettings

__all__ = ["WasmConfig", "WasmRuntime"]


def _factory(settings: NodeSettings) -> Runtime:
    return WasmRuntime(WasmConfig.from_settings(settings))


registry.register(WasmRuntime.name, _factory)
