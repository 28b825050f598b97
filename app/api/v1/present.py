"""Turn a stored invocation into API bodies: every answer is a projection of the row."""

from __future__ import annotations

from app.db.invocations import StoredInvocation
from app.invocations.projection import Projection, timings
from app.schemas.invocations import InvocationOut
from app.schemas.run import RunResponse


def run_response(row: StoredInvocation, projection: Projection) -> RunResponse:
    return RunResponse(**_fields(row, projection))


def invocation_out(row: StoredInvocation, projection: Projection) -> InvocationOut:
    return InvocationOut(
        **_fields(row, projection),
        kind=row.kind,
        language=row.language,
        runtime=row.runtime,
        node_id=row.node_id,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )


def _fields(row: StoredInvocation, projection: Projection) -> dict[str, object]:
    result = projection.result
    return {
        "invocation_id": row.id,
        "status": row.status,
        "error": row.error,
        "attempts": row.attempts,
        "contended": bool(result and result.contended),
        "compile": result.compile if result else None,
        "run": result.run if result else None,
        "files": result.files if result else {},
        "timings": timings(row),
        "omitted_outputs": projection.omitted,
        "created_at": row.created_at,
    }
