"""What every answer shows of a stored invocation: its result and its phase timings.

An answer is always built from the stored row (``app.api.v1.present`` for runs,
``app.functions.outcome`` for functions), whether the row came back from the recorder
in this process or was read from the database, so both answers are the same. ``load``
puts back the large parts the row keeps in blobs (``app.db.outputs``); a list, or a batch
answer past ``max_batch_response_bytes``, shows their previews and names them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker

from app.db import blobs, outputs
from app.db.invocations import StoredInvocation
from app.schemas.run import Timings
from wire.execution import RunResult

#: Why an answer shows only the preview of a large part.
EXPIRED = "expired"  #: its blob is older than the blob retention, and deleted
ELIDED = "batch_response_cap"  #: a batch answer had no room left for it
LISTED = "listed"  #: a list shows every part's preview only


@dataclass(slots=True)
class ResponseBudget:
    """How many bytes of large parts one answer (a batch) may still carry in full."""

    remaining: int

    def take(self, size: int) -> bool:
        if size > self.remaining:
            return False
        self.remaining -= size
        return True


@dataclass(frozen=True, slots=True)
class Projection:
    """A stored invocation's result, whole where its large parts could be included."""

    result: RunResult | None
    #: The large parts shown only as their preview, and why (``EXPIRED``, ``ELIDED``, ``LISTED``).
    omitted: dict[str, str] = field(default_factory=dict)


async def load(
    sessions: async_sessionmaker[Any], row: StoredInvocation, budget: ResponseBudget | None = None
) -> Projection:
    """The whole result of ``row``: its large parts read back from their blobs, unless
    ``budget`` has no room left for them."""
    if row.result is None:
        return Projection(None)
    ids = outputs.blob_ids(row.result)
    if not ids:
        return _joined(row, {}, EXPIRED)
    if budget is not None and not budget.take(outputs.blob_bytes(row.result)):
        return _joined(row, {}, ELIDED)
    async with sessions() as session:
        contents = await blobs.fetch(session, ids)
    return _joined(row, contents, EXPIRED)


def preview(row: StoredInvocation) -> Projection:
    """The result as the row holds it: large parts as their previews, marked truncated."""
    if row.result is None:
        return Projection(None)
    return _joined(row, {}, LISTED)


def _joined(row: StoredInvocation, contents: dict[str, bytes], missing_because: str) -> Projection:
    result, missing = outputs.join_result(row.result or {}, row.stdout, row.stderr, contents)
    return Projection(result, dict.fromkeys(missing, missing_because))


def timings(row: StoredInvocation) -> Timings:
    """The phase timings of a stored invocation."""
    total = None
    if row.finished_at and row.created_at:
        total = (row.finished_at - row.created_at).total_seconds() * 1000
    return Timings(
        queue_ms=row.queue_ms,
        setup_ms=row.setup_ms,
        exec_ms=row.exec_ms,
        teardown_ms=row.teardown_ms,
        total_ms=total,
        cpu_ms=row.cpu_ms,
        peak_memory_kb=row.peak_memory_kb,
    )
