"""The host side of one instance: its directory and the files of a call.

``<run_dir>/<instance id>/`` holds ``stdin`` (a warm instance's FIFO) and ``work/``, the
only directory the guest sees (preopened as ``/work`` and as ``.``, read-only unless
configured otherwise). The host writes ``spec.files`` into ``work/`` before the call and
reads ``fetch_files`` back after the guest is gone, never following symlinks out of it.

A fresh instance whose call has no files to write or fetch, on a node whose work dirs
are read-only, gets ``HostDir.shared_empty`` instead: one empty directory, made once and
never removed, that every such call sees. WASI enforces the read-only preopen (creating,
writing or removing anything in it fails with ``EPERM``; ``tests/node/fncall/wasm``), so no
call can leave anything there for another, and the call saves a directory's creation and
removal (the largest host-side items of a small module's call).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from node.workfiles import InvalidSpec, check_relpath
from wire.execution import RunSpec


def decode_files(spec: RunSpec, *, max_bytes: int) -> dict[str, bytes]:
    """``spec.files`` decoded and checked; code and stdin count towards ``max_bytes``."""
    total = len(spec.code.encode("utf-8", "replace")) + len(spec.stdin.encode("utf-8", "replace"))
    files: dict[str, bytes] = {}
    for path, encoded in spec.files.items():
        check_relpath(path, "file")
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidSpec(f"file {path!r} is not valid base64: {exc}") from None
        total += len(data)
        if total > max_bytes:
            raise InvalidSpec(f"code, stdin and files add up to more than {max_bytes} bytes")
        files[path] = data
    for path in spec.fetch_files:
        check_relpath(path, "fetch_files entry")
    return files


SHARED_EMPTY = "empty"


@dataclass
class HostDir:
    root: Path
    shared: bool = False  #: ``shared_empty``'s: read-only for guests, never removed

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def stdin(self) -> Path:
        return self.root / "stdin"

    @classmethod
    def create(cls, run_dir: Path, name: str) -> HostDir:
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        root = run_dir / name
        root.mkdir(mode=0o700)
        (root / "work").mkdir(mode=0o755)
        return cls(root)

    @classmethod
    def shared_empty(cls, run_dir: Path) -> HostDir:
        """The empty directory of calls that write and fetch nothing (made if missing;
        instance dirs are named ``i<n>``, so this name is never one of theirs)."""
        root = run_dir / SHARED_EMPTY
        work = root / "work"
        if not work.is_dir():
            run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            root.mkdir(mode=0o700, exist_ok=True)
            work.mkdir(mode=0o555, exist_ok=True)
        return cls(root, shared=True)

    def write_files(self, files: dict[str, bytes]) -> None:
        if files and self.shared:
            raise RuntimeError("files cannot be written into the shared empty directory")
        for rel, data in files.items():
            target = self.work / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as out:
                out.write(data)

    def read_files(self, paths: list[str], *, max_bytes: int) -> tuple[dict[str, str], list[str]]:
        """Fetched files as base64 and notes about those that could not be fetched."""
        found: dict[str, str] = {}
        notes: list[str] = []
        budget = max_bytes
        work = self.work.resolve()
        for rel in paths:
            target = self.work / rel
            try:
                if not target.resolve().is_relative_to(work):
                    raise FileNotFoundError
                fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                notes.append(f"fetch {rel}: no such file")
                continue
            with os.fdopen(fd, "rb") as src:
                info = os.fstat(src.fileno())
                if not stat.S_ISREG(info.st_mode):
                    notes.append(f"fetch {rel}: not a regular file")
                    continue
                if info.st_size > budget:
                    notes.append(f"fetch {rel}: over the {max_bytes}-byte fetch limit")
                    continue
                data = src.read(budget + 1)
            budget -= len(data)
            found[rel] = base64.b64encode(data).decode("ascii")
        return found, notes

    def remove(self) -> None:
        if self.shared:
            return
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.root)
