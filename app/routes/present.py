"""Turn a stored invocation (and the inline result, when there is one) into API bodies."""

from __future__ import annotations

from app.db.models import Invocation
from app.schemas.invocations import InvocationOut
from app.schemas.run import RunResponse, Timings
from runtimes.models import RunResult


def stored_result(row: Invocation) -> RunResult | None:
    """The RunResult a node stored, with the run stage's output put back from its columns."""
    if row.result is None:
        return None
    result = RunResult.model_validate(row.result)
    if result.run is not None:
        result.run.stdout, result.run.stderr = row.stdout, row.stderr
    return result


def run_response(row: Invocation, result: RunResult | None = None) -> RunResponse:
    return RunResponse(**_fields(row, result))


def invocation_out(row: Invocation) -> InvocationOut:
    return InvocationOut(
        **_fields(row, None),
        kind=row.kind,
        language=row.language,
        runtime=row.runtime,
        node_id=row.node_id,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )


def _fields(row: Invocation, result: RunResult | None) -> dict[str, object]:
    result = result or stored_result(row)
    total = None
    if row.finished_at and row.created_at:
        total = (row.finished_at - row.created_at).total_seconds() * 1000
    return {
        "invocation_id": row.id,
        "status": row.status,
        "error": row.error,
        "attempts": row.attempts,
        "compile": result.compile if result else None,
        "run": result.run if result else None,
        "files": result.files if result else {},
        "timings": Timings(
            queue_ms=row.queue_ms,
            setup_ms=row.setup_ms,
            exec_ms=row.exec_ms,
            teardown_ms=row.teardown_ms,
            total_ms=total,
            cpu_ms=row.cpu_ms,
            peak_memory_kb=row.peak_memory_kb,
        ),
        "created_at": row.created_at,
    }
