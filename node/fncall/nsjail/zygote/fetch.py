"""Fetching files back after the call: regular files inside the work dir only, within
one byte budget, each refusal noted."""

from __future__ import annotations

import base64
import os
import stat

from node.fncall.nsjail.zygote.common import CHUNK, WORK
from node.fncall.nsjail.zygote.staging import InputError, _safe_relpath


def _fetch(paths: list[str], budget: int) -> tuple[dict[str, str], list[str]]:
    files: dict[str, str] = {}
    notes: list[str] = []
    for rel in paths:
        try:
            full = os.path.join(WORK, _safe_relpath(rel))
        except InputError as exc:
            notes.append(str(exc))
            continue
        real = os.path.realpath(full)
        if not real.startswith(WORK + "/"):
            notes.append(f"fetch {rel!r}: not inside the work dir")
            continue
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            notes.append(f"fetch {rel!r}: {exc.strerror}")
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                notes.append(f"fetch {rel!r}: not a regular file")
                continue
            if info.st_size > budget:
                notes.append(f"fetch {rel!r}: {info.st_size} bytes exceeds the fetch budget")
                continue
            data = bytearray()
            while len(data) <= budget:
                chunk = os.read(fd, CHUNK)
                if not chunk:
                    break
                data += chunk
            if len(data) > budget:
                notes.append(f"fetch {rel!r}: grew past the fetch budget")
                continue
            budget -= len(data)
            files[rel] = base64.b64encode(data).decode("ascii")
        finally:
            os.close(fd)
    return files, notes
