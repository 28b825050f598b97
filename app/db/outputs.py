"""What of an invocation its row keeps, and what goes to blobs.

A part bigger than ``INLINE_BYTES`` (the run's or the compile's stdout or stderr, each
fetched file, the request's code or stdin) is stored as a blob (``app.db.blobs``) kept
for the blob retention; the row keeps a preview of ``PREVIEW_CHARS`` (none for files) and,
under ``"$blobs"`` in its JSON, which blob holds each part and its size. ``join_result``
puts the parts back; a part it is not given (its blob has expired, or the answer has no
room for it) answers as its preview, marked truncated, and is named among the missing.
The rows therefore stay small whatever programs print, and the database holds large
outputs only for as long as the retention says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from wire.execution import RunResult, StageResult
from wire.ids import new_id

#: Parts up to this size (UTF-8 bytes) stay in the row.
INLINE_BYTES = 64 * 1024
#: What the row keeps of a larger text part.
PREVIEW_CHARS = 4 * 1024
REFS = "$blobs"


@dataclass(frozen=True, slots=True)
class BlobPart:
    id: str
    name: str  #: run.stdout, compile.stderr, files/<path>, request.code, ...
    data: bytes


@dataclass
class Split:
    """A result as its row stores it."""

    result: dict[str, Any]  #: the JSON column
    stdout: str  #: the run stage's stdout column (preview if in a blob)
    stderr: str
    blobs: list[BlobPart] = field(default_factory=list)


def fits_text_column(text: str) -> bool:
    """Whether every database's text column can hold ``text``: PostgreSQL's cannot hold
    NUL (a program may well print one; its JSON can, escaped)."""
    return "\x00" not in text


class _Taker:
    def __init__(self) -> None:
        self.blobs: list[BlobPart] = []
        self.refs: dict[str, dict[str, Any]] = {}

    def take(self, name: str, text: str, *, preview: bool = True) -> str:
        """What the row keeps of ``text``: itself, or its preview and a blob."""
        data = text.encode("utf-8", "surrogatepass")
        if len(data) <= INLINE_BYTES:
            return text
        blob = BlobPart(new_id("blob"), name, data)
        self.blobs.append(blob)
        self.refs[name] = {"id": blob.id, "size": len(data)}
        return text[:PREVIEW_CHARS] if preview else ""


def split_result(result: RunResult) -> Split:
    stored = result.model_dump(mode="json")
    taker = _Taker()
    columns = {"stdout": "", "stderr": ""}
    for stage_name in ("compile", "run"):
        stage = stored.get(stage_name)
        if not stage:
            continue
        for stream in ("stdout", "stderr"):
            kept = taker.take(f"{stage_name}.{stream}", stage[stream])
            if stage_name == "run" and fits_text_column(kept):
                columns[stream], stage[stream] = kept, ""  # the run's output has columns
            else:
                stage[stream] = kept  # JSON escapes a NUL
    for path, content in list(stored.get("files", {}).items()):
        stored["files"][path] = taker.take(f"files/{path}", content, preview=False)
    if taker.refs:
        stored[REFS] = taker.refs
    return Split(stored, columns["stdout"], columns["stderr"], taker.blobs)


def split_request(request: dict[str, Any]) -> tuple[dict[str, Any], list[BlobPart]]:
    """What the row keeps of a request record: large code or stdin go to blobs."""
    taker = _Taker()
    kept = dict(request)
    for key in ("code", "stdin"):
        if isinstance(kept.get(key), str):
            kept[key] = taker.take(f"request.{key}", kept[key])
    if taker.refs:
        kept[REFS] = taker.refs
    return kept, taker.blobs


def blob_ids(stored: Mapping[str, Any] | None) -> list[str]:
    refs = (stored or {}).get(REFS) or {}
    return [ref["id"] for ref in refs.values()]


def blob_bytes(stored: Mapping[str, Any] | None) -> int:
    """The size of the parts ``stored`` keeps in blobs."""
    refs = (stored or {}).get(REFS) or {}
    return sum(int(ref["size"]) for ref in refs.values())


def join_result(
    stored: Mapping[str, Any],
    stdout: str,
    stderr: str,
    contents: Mapping[str, bytes],
) -> tuple[RunResult, list[str]]:
    """The result a node reported, its parts put back from the columns and ``contents``
    (blob id -> bytes); and the names of the parts not in ``contents``."""
    data = dict(stored)
    refs: dict[str, dict[str, Any]] = data.pop(REFS, None) or {}
    result = RunResult.model_validate(data)
    if result.run is not None:
        result.run.stdout = stdout or result.run.stdout
        result.run.stderr = stderr or result.run.stderr
    missing: list[str] = []
    for name, ref in refs.items():
        content = contents.get(ref["id"])
        if content is None:
            missing.append(name)
        _put(result, name, None if content is None else content.decode("utf-8", "surrogatepass"))
    return result, missing


def _put(result: RunResult, name: str, text: str | None) -> None:
    """Put part ``name`` back (None: it is missing; its preview stays, marked truncated)."""
    if name.startswith("files/"):
        path = name.removeprefix("files/")
        if text is None:
            result.files.pop(path, None)
        else:
            result.files[path] = text
        return
    stage_name, _, stream = name.partition(".")
    stage: StageResult | None = getattr(result, stage_name, None)
    if stage is None or stream not in ("stdout", "stderr"):
        return
    if text is None:
        setattr(stage, f"{stream}_truncated", True)
    else:
        setattr(stage, stream, text)
