"""The program of a compile jail: compile one module and write its ``.cwasm`` out.

Runs inside a jail (``node.fncall.wasm.jail``) started by ``node.fncall.wasm.compiler`` for one
module and then gone, so a module that subverts the compiler reaches only its own output.
stdin: one frame (``node.fncall.wasm.protocol``) ``{config, parallel}`` + the module's bytes
(a core module, or a component: ``node.fncall.wasm.pycomponent``).
stdout: one frame ``{}`` + the serialized module, or ``{error}`` when the bytes are not a
valid module. Exit status 0 either way; anything else (killed by its CPU or memory limit)
is judged by the host.
"""

from __future__ import annotations

import json
import os
import sys

from node.fncall.wasm.protocol import HEADER, encode


def _read_exact(fd: int, size: int) -> bytes:
    parts: list[bytes] = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise EOFError("stdin ended early")
        parts.append(chunk)
        size -= len(chunk)
    return b"".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main() -> None:
    from node.fncall.wasm.seccomp import install_no_exec

    install_no_exec()
    json_len, blob_len = HEADER.unpack(_read_exact(0, HEADER.size))
    msg = json.loads(_read_exact(0, json_len))
    data = _read_exact(0, blob_len)

    from wasmtime import Engine, Module, WasmtimeError
    from wasmtime.component import Component

    from node.fncall.wasm.config import WasmConfig
    from node.fncall.wasm.engine import engine_config
    from node.fncall.wasm.pycomponent import is_component

    config = WasmConfig.model_validate(msg["config"])
    engine = Engine(engine_config(config, parallel=bool(msg.get("parallel"))))
    try:
        code = Component(engine, data) if is_component(data) else Module(engine, data)
        compiled = bytes(code.serialize())
    except WasmtimeError as exc:
        text = " ".join(str(exc).split())
        _write_all(1, encode({"op": "compiled", "error": text[:600]}))
        sys.exit(0)
    _write_all(1, encode({"op": "compiled"}, compiled))
