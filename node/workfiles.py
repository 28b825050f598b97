"""Checks shared by every backend on the files a RunSpec puts in (or fetches from) a work
dir: a path must stay inside it."""

from __future__ import annotations

#: Longest relative path accepted in ``files`` and ``fetch_files``.
MAX_PATH_CHARS = 1024


class InvalidSpec(ValueError):
    """The request itself is unusable (bad path, bad base64, too large)."""


def check_relpath(path: str, what: str) -> None:
    """A path relative to the work dir: no absolute paths, '..', '.', empty parts, NULs."""
    if not path or "\0" in path or "\\" in path:
        raise InvalidSpec(f"{what} {path!r} is not a valid path")
    if path.startswith("/"):
        raise InvalidSpec(f"{what} {path!r} must be relative to the work dir")
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise InvalidSpec(f"{what} {path!r} must not contain '', '.' or '..' components")
    if len(path) > MAX_PATH_CHARS:
        raise InvalidSpec(f"{what} path is longer than {MAX_PATH_CHARS} characters")
