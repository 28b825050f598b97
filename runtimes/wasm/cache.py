"""The on-disk cache of compiled modules: ``<cache>/<engine fingerprint>/<sha256>.cwasm``.

A ``.cwasm`` is native code produced by ``Module.serialize`` for one engine configuration;
``Module.deserialize_file`` maps it in (about 2 ms for CPython instead of 5-9 s of
compiling). Only this process writes the directory, so it must not be writable by anyone
else: loading a ``.cwasm`` runs its code without checks. Entries are written to a
temporary name and renamed, so a crash never leaves a half-written entry; an entry the
engine refuses (another wasmtime build) is deleted and compiled again. The total size is
kept under ``max_bytes`` by deleting the least recently used entries.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

from wasmtime import Engine, Module, WasmtimeError

log = logging.getLogger(__name__)

SUFFIX = ".cwasm"
STALE_TMP_S = 3600.0


class ModuleCache:
    def __init__(self, root: Path, fingerprint: str, *, max_bytes: int) -> None:
        self.dir = root / fingerprint
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def path_for(self, sha256: str) -> Path:
        return self.dir / f"{sha256}{SUFFIX}"

    def load(self, engine: Engine, sha256: str) -> Module | None:
        """The cached module, or None when absent or refused by this engine."""
        path = self.path_for(sha256)
        if not path.is_file():
            return None
        try:
            module = Module.deserialize_file(engine, str(path))
        except WasmtimeError as exc:
            log.warning("wasm cache: dropping unusable entry %s: %s", path.name, exc)
            path.unlink(missing_ok=True)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recency for LRU eviction
        return module

    def store(self, module: Module, sha256: str) -> Path:
        """Write ``module`` as the entry for ``sha256`` (atomically), then evict."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.path_for(sha256)
        data = module.serialize()
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-", suffix=SUFFIX)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.evict(keep=path)
        return path

    def evict(self, *, keep: Path | None = None) -> None:
        """Delete least recently used entries until the cache fits ``max_bytes``."""
        with self._lock:
            entries: list[tuple[float, int, Path]] = []
            for path in self.dir.glob(f"*{SUFFIX}"):
                try:
                    st = path.stat()
                except OSError:
                    continue
                if path.name.startswith(".tmp-"):
                    if time.time() - st.st_mtime > STALE_TMP_S:  # left by a crash
                        path.unlink(missing_ok=True)
                    continue
                entries.append((st.st_mtime, st.st_size, path))
            total = sum(size for _, size, _ in entries)
            for _, size, path in sorted(entries):
                if total <= self.max_bytes:
                    break
                if path == keep:
                    continue
                path.unlink(missing_ok=True)  # a mapped entry stays valid until unmapped
                total -= size
                log.info("wasm cache: evicted %s (%d bytes)", path.name, size)
