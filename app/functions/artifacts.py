"""Artifacts: the bytes a function version runs. Checked and hashed at registration,
cached after the first read (content-addressed, so never stale).
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import re
import threading
from collections import OrderedDict

from app.errors import InvalidArtifact, PayloadTooLarge, ValidationFailed
from app.functions import wasm_check
from app.functions.languages import MAX_CODE_BYTES, MAX_MODULE_BYTES, Driver

_JS_IDENTIFIER = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")

#: Bytes of artifacts kept in memory by one gateway.
CACHE_BYTES = 64 * 1024 * 1024


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_entry_point(driver: Driver, entry_point: str) -> None:
    if driver is Driver.MODULE:
        return
    ok = (
        entry_point.isidentifier()
        if driver is Driver.PYTHON
        else bool(_JS_IDENTIFIER.match(entry_point))
    )
    if not ok:
        raise ValidationFailed(f"entry_point {entry_point!r} is not an identifier")


async def check_artifact(driver: Driver, data: bytes, entry_point: str) -> None:
    """Raise 413 when ``data`` is too large, 422 ``invalid_artifact`` when it is unusable."""
    limit = MAX_MODULE_BYTES if driver is Driver.MODULE else MAX_CODE_BYTES
    if len(data) > limit:
        what = "module" if driver is Driver.MODULE else "code"
        raise PayloadTooLarge(f"the {what} is {len(data)} bytes; at most {limit} are accepted")
    if not data:
        raise InvalidArtifact("the function's code or module is empty")
    if driver is Driver.MODULE:
        await asyncio.to_thread(wasm_check.check_module, data)
        return
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArtifact("the code is not UTF-8 text") from None
    if driver is Driver.PYTHON:
        _check_python(source, entry_point)


def _check_python(source: str, entry_point: str) -> None:
    """Syntax, and a top-level definition of the entry point (def, class, = or import)."""
    try:
        tree = ast.parse(source, "<function>")
    except SyntaxError as exc:
        raise InvalidArtifact(
            f"the code has a syntax error at line {exc.lineno}: {exc.msg}",
            details={"line": exc.lineno, "offset": exc.offset},
        ) from None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        else:
            return  # conditional or dynamic definitions: trust the code, fail at call time
    if entry_point not in names:
        raise InvalidArtifact(f"the code defines no top-level {entry_point!r}")


class ArtifactCache:
    """Artifacts by (tenant, SHA-256), least recently used dropped past ``max_bytes``."""

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        self._max = max_bytes
        self._size = 0
        self._items: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, tenant_id: str, digest: str) -> bytes | None:
        with self._lock:
            data = self._items.get((tenant_id, digest))
            if data is not None:
                self._items.move_to_end((tenant_id, digest))
            return data

    def put(self, tenant_id: str, digest: str, data: bytes) -> None:
        if len(data) > self._max:
            return
        with self._lock:
            if (tenant_id, digest) in self._items:
                return
            self._items[(tenant_id, digest)] = data
            self._size += len(data)
            while self._size > self._max:
                _, old = self._items.popitem(last=False)
                self._size -= len(old)
