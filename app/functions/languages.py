"""The languages a function can be registered in, and the kind of artifact each takes."""

from __future__ import annotations

from enum import StrEnum


class Driver(StrEnum):
    """How an artifact is turned into a program (see ``app.functions.drivers``)."""

    PYTHON = "python"  #: CPython source defining the entry point
    NODE = "node"  #: JavaScript for Node.js (nsjail ``nodejs``)
    QUICKJS = "quickjs"  #: JavaScript for QuickJS (``wasm-javascript``)
    MODULE = "module"  #: a raw WASI command module: JSON on stdin, JSON on stdout


#: language -> driver. A language not listed cannot be registered as a function.
LANGUAGES: dict[str, Driver] = {
    "python": Driver.PYTHON,
    "wasm-python": Driver.PYTHON,
    "nodejs": Driver.NODE,
    "wasm-javascript": Driver.QUICKJS,
    "wasm": Driver.MODULE,
}

#: Largest source text (UTF-8 bytes) and largest ``.wasm`` module accepted.
MAX_CODE_BYTES = 1024 * 1024
MAX_MODULE_BYTES = 16 * 1024 * 1024

#: The entry point of a raw module: WASI's command entry, fixed.
MODULE_ENTRY_POINT = "_start"
