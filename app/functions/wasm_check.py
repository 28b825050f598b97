"""Check a WebAssembly module at registration, so a bad upload fails with a clear 422.

wasmtime's ``Module.validate`` checks the binary (cheap: no compilation). The import
and export sections are then read directly from the binary: a function module must be
a WASI preview 1 *command*, importing only from ``wasi_snapshot_preview1`` and
exporting ``_start``. Node agents check the same again when they load the module.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field

from wasmtime import Engine, Module, WasmtimeError

from app.errors import InvalidArtifact

log = logging.getLogger(__name__)

WASI_MODULE = "wasi_snapshot_preview1"
_MAGIC = b"\0asm"
_CORE_VERSION = b"\x01\x00\x00\x00"
_IMPORT_SECTION, _EXPORT_SECTION = 2, 7
_FUNC_KIND = 0


@dataclass(slots=True)
class ModuleInterface:
    imports: list[tuple[str, str]] = field(default_factory=list)
    exports: dict[str, int] = field(default_factory=dict)  # name -> kind (0 = function)


@functools.cache
def _engine() -> Engine:
    return Engine()


def check_module(data: bytes) -> ModuleInterface:
    """Raise ``InvalidArtifact`` unless ``data`` is a usable WASI command module.

    Blocking (validation is linear in the module's size): call it in a thread.
    """
    if data[:4] != _MAGIC:
        raise InvalidArtifact("the module is not a WebAssembly binary (no \\0asm header)")
    if data[4:8] != _CORE_VERSION:
        raise InvalidArtifact(
            "the module is not a core WebAssembly module (version 1); components are not supported"
        )
    try:
        Module.validate(_engine(), data)
    except WasmtimeError as exc:
        raise InvalidArtifact(f"the module is not valid WebAssembly: {_first_line(exc)}") from None
    try:
        interface = read_interface(data)
    except (IndexError, ValueError, UnicodeDecodeError) as exc:
        # Valid for wasmtime but beyond this reader (a newer proposal): the node decides.
        log.info("cannot read the import/export sections (%s); left to the node", exc)
        return ModuleInterface()
    foreign = [f"{m}.{n}" for m, n in interface.imports if m != WASI_MODULE]
    if foreign:
        raise InvalidArtifact(
            f"the module imports {', '.join(foreign[:5])}"
            + (f" (and {len(foreign) - 5} more)" if len(foreign) > 5 else "")
            + f"; only {WASI_MODULE} functions are offered",
            details={"unsupported_imports": foreign},
        )
    if interface.exports.get("_start") != _FUNC_KIND:
        raise InvalidArtifact("the module exports no _start function: build a WASI command")
    return interface


def read_interface(data: bytes) -> ModuleInterface:
    """The imports and exports of a module (which must already be valid)."""
    reader = _Reader(data, 8)
    interface = ModuleInterface()
    while reader.pos < len(data):
        section = reader.byte()
        size = reader.uleb()
        end = reader.pos + size
        if section == _IMPORT_SECTION:
            for _ in range(reader.uleb()):
                module, name = reader.name(), reader.name()
                interface.imports.append((module, name))
                reader.skip_import_desc()
        elif section == _EXPORT_SECTION:
            for _ in range(reader.uleb()):
                name = reader.name()
                kind = reader.byte()
                reader.uleb()
                interface.exports[name] = kind
        reader.pos = end
    return interface


class _Reader:
    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    def byte(self) -> int:
        value = self.data[self.pos]
        self.pos += 1
        return value

    def uleb(self) -> int:
        result = shift = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 70:
                raise ValueError("LEB128 too long")

    def name(self) -> str:
        size = self.uleb()
        raw = self.data[self.pos : self.pos + size]
        if len(raw) != size:
            raise ValueError("truncated name")
        self.pos += size
        return raw.decode("utf-8")

    def limits(self) -> None:
        flags = self.byte()
        self.uleb()
        if flags & 0x01:
            self.uleb()

    def skip_import_desc(self) -> None:
        kind = self.byte()
        if kind == 0:  # function: type index
            self.uleb()
        elif kind == 1:  # table: reference type, limits
            if self.byte() in (0x63, 0x64):  # (ref null? heaptype): typed references
                self.uleb()
            self.limits()
        elif kind == 2:  # memory: limits
            self.limits()
        elif kind == 3:  # global: value type, mutability
            if self.byte() in (0x63, 0x64):
                self.uleb()
            self.byte()
        elif kind == 4:  # tag: attribute, type index
            self.byte()
            self.uleb()
        else:
            raise ValueError(f"unknown import kind {kind}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
