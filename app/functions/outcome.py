"""Turn a finished invocation into a function result: parsed output or a typed error.

The invocation record keeps what the node reported (``succeeded`` means exit code 0);
the function's view adds one rule: stdout must be one JSON value, or the invocation is
``failed`` with ``bad_function_output``.
"""

from __future__ import annotations

import json

from app.db.invocations import StoredInvocation
from app.invocations.projection import Projection, timings
from app.schemas.functions import FunctionError, InvokeResponse
from wire.execution import StageResult, StageStatus

#: Characters of stderr returned as ``logs``.
MAX_LOG_CHARS = 64 * 1024

_STAGE_CODES = {
    StageStatus.TIME_LIMIT: "time_limit",
    StageStatus.MEMORY_LIMIT: "memory_limit",
    StageStatus.OUTPUT_LIMIT: "output_limit",
    StageStatus.KILLED: "killed",
    StageStatus.ERROR: "start_error",
}


def invoke_response(
    row: StoredInvocation, projection: Projection, *, function: str, version: int
) -> InvokeResponse:
    result = projection.result
    stage = (result.run or result.compile) if result else None
    logs = stage.stderr if stage else ""
    response = InvokeResponse(
        invocation_id=row.id,
        function=function,
        version=version,
        status=row.status,
        logs=logs[:MAX_LOG_CHARS],
        logs_truncated=len(logs) > MAX_LOG_CHARS or bool(stage and stage.stderr_truncated),
        timings=timings(row),
    )
    if row.status in ("queued", "running"):
        return response
    if row.status == "errored" or result is None or stage is None:
        response.status = "errored"
        response.error = FunctionError(
            code="platform_error", message=row.error or "the platform failed to run the function"
        )
        return response
    if not stage.ok:
        response.status = "failed"
        response.error = _stage_error(stage)
        return response
    stage_name = "run" if result.run is not None else "compile"
    omitted = projection.omitted.get(f"{stage_name}.stdout")
    if omitted is not None:  # the output is there, but not in this answer
        response.omitted_outputs = {"output": omitted}
        return response
    if stage.stdout_truncated:
        response.status = "failed"
        response.error = FunctionError(
            code="bad_function_output", message="the output is over the output limit"
        )
        return response
    try:
        response.output = json.loads(stage.stdout)
    except ValueError as exc:
        response.status = "failed"
        response.error = FunctionError(
            code="bad_function_output",
            message=f"stdout is not one JSON value: {exc}",
            details={"stdout": stage.stdout[:200]},
        )
    return response


def _stage_error(stage: StageResult) -> FunctionError:
    details = {"stage_status": stage.status.value, "exit_code": stage.exit_code}
    if stage.status is StageStatus.FINISHED:
        last = stage.stderr.strip().splitlines()[-1:] or [""]
        message = f"exited with code {stage.exit_code}" + (f": {last[0][:500]}" if last[0] else "")
        return FunctionError(code="function_error", message=message, details=details)
    code = _STAGE_CODES.get(stage.status, "killed")
    message = stage.message or stage.status.value.replace("_", " ")
    return FunctionError(code=code, message=message, details=details)
