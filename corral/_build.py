"""``client.images.build``: what the sync and async clients share to build one of the
tenant's images through the API (``POST /v1/images``).

The context is sent as a gzip tar archive: a directory is archived here (its files read,
symlinks kept as links), a file is taken as an archive already, bytes as they are. The
answer is the build's log, NDJSON: each line is handed to ``on_log`` as it comes, and the
last one is the image (returned) or the build's error (raised as its ``CorralError``).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from corral._errors import BY_CODE, CorralError, QuotaExceeded, UnexpectedResponse

#: what ``context`` may be: a directory, an archive's path, or an archive's bytes
Context = str | os.PathLike[str] | bytes | None
OnLog = Callable[[dict[str, Any]], None]
#: the server's default time for a build
DEFAULT_BUILD_S = 1800.0


def context_bytes(context: Context) -> bytes | None:
    """The context archive to send (a directory archived, gzip)."""
    if context is None or isinstance(context, bytes):
        return context
    path = Path(context)
    if not path.is_dir():
        return path.read_bytes()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for entry in sorted(path.iterdir()):
            tar.add(entry, arcname=entry.name, recursive=True)
    return buffer.getvalue()


def build_request(
    name: str,
    *,
    dockerfile: str,
    context: Context,
    network: str | Mapping[str, Any] | None,
    cpu: float | None,
    memory_mb: int | None,
    disk_mb: int | None,
    timeout_s: float | None,
) -> dict[str, Any]:
    """The multipart request's ``data`` and ``files``."""
    data: dict[str, str] = {"name": name}
    if network is not None:
        data["network"] = network if isinstance(network, str) else json.dumps(dict(network))
    for key, value in (
        ("cpu", cpu),
        ("memory_mb", memory_mb),
        ("disk_mb", disk_mb),
        ("timeout_s", timeout_s),
    ):
        if value is not None:
            data[key] = str(value)
    files: dict[str, Any] = {"dockerfile": ("Dockerfile", dockerfile.encode())}
    archive = context_bytes(context)
    if archive is not None:
        files["context"] = ("context.tar.gz", archive, "application/gzip")
    return {"data": data, "files": files}


def read_timeout(timeout_s: float | None) -> httpx.Timeout:
    """How long to wait for the build log's next line: a RUN may be silent for as long
    as the build may take."""
    return httpx.Timeout(60.0, read=(timeout_s or DEFAULT_BUILD_S) + 60.0)


class BuildLog:
    """The lines of a build's log, read one by one: ``on_log`` sees each; ``result``
    is the image, or raises the build's error."""

    def __init__(self, on_log: OnLog | None) -> None:
        self._on_log = on_log
        self._last: dict[str, Any] | None = None

    def line(self, text: str) -> None:
        if not text.strip():
            return
        try:
            event = json.loads(text)
        except ValueError:
            raise UnexpectedResponse(f"not a build log line: {text[:200]!r}") from None
        if not isinstance(event, dict):
            raise UnexpectedResponse(f"not a build log line: {text[:200]!r}")
        self._last = event
        if self._on_log is not None:
            self._on_log(event)

    def result(self) -> dict[str, Any]:
        last = self._last or {}
        if isinstance(last.get("image"), dict):
            image: dict[str, Any] = last["image"]
            return image
        error = last.get("error")
        if isinstance(error, dict):
            code, message = str(error.get("code")), str(error.get("message"))
            quota = code.endswith("_exhausted") or code == "concurrency_limited"
            cls = BY_CODE.get(code) or (QuotaExceeded if quota else CorralError)
            raise cls(message, code=code)
        raise UnexpectedResponse("the build's log ended without its image or its error")
