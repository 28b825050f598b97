"""Staging a call: its files, sources and standard input written into the work dir,
every path checked to stay inside it."""

from __future__ import annotations

import base64
import os
from typing import Any

from node.fncall.nsjail.zygote.common import STDIN_FILE, WORK


class InputError(Exception):
    """The request names a bad path or carries undecodable data."""


def _safe_relpath(path: str) -> str:
    if not isinstance(path, str) or not path or "\0" in path or "\\" in path:
        raise InputError(f"invalid file path {path!r}")
    if path.startswith("/"):
        raise InputError(f"file path {path!r} must be relative to the work dir")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise InputError(f"file path {path!r} must not contain '', '.' or '..' components")
    return path


def _write_file(rel: str, data: bytes) -> None:
    full = os.path.join(WORK, _safe_relpath(rel))
    parent = os.path.dirname(full)
    os.makedirs(parent, exist_ok=True)
    if os.path.realpath(parent) != parent:
        raise InputError(f"file path {rel!r} leaves the work dir")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(full, flags, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _prepare(request: dict[str, Any]) -> None:
    os.mkdir(WORK, 0o755)
    for rel, encoded in request.get("files", {}).items():
        try:
            data = base64.b64decode(encoded, validate=True)
        except (ValueError, TypeError) as exc:
            raise InputError(f"file {rel!r} is not valid base64") from exc
        _write_file(rel, data)
    for rel, text in request.get("sources", {}).items():
        _write_file(rel, text.encode("utf-8"))
    data = request.get("stdin", "").encode("utf-8")
    fd = os.open(STDIN_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
