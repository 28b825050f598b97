"""What every answer shows of a stored invocation: its result and its phase timings.

An answer is always built from the stored row (``app.routes.present`` for runs,
``app.functions.outcome`` for functions), whether the row came back from the recorder
in this process or was read from the database, so both answers are the same.
"""

from __future__ import annotations

from app.db.models import Invocation
from app.schemas.run import Timings
from wire.execution import RunResult


def stored_result(row: Invocation) -> RunResult | None:
    """The RunResult a node reported, with the run stage's output put back from its columns
    (or kept in the result's JSON, where output with a NUL is stored: ``app.db.invocations``)."""
    if row.result is None:
        return None
    result = RunResult.model_validate(row.result)
    if result.run is not None:
        result.run.stdout = row.stdout or result.run.stdout
        result.run.stderr = row.stderr or result.run.stderr
    return result


def timings(row: Invocation) -> Timings:
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
