"""``POST /v1/run``: run source code once on a jailed, pre-initialised worker."""

from __future__ import annotations

import asyncio

from app.errors import CorralError
from app.http.endpoint import Call, endpoint
from app.routes.present import run_response
from app.schemas.run import (
    BatchItem,
    BatchItemError,
    BatchRunRequest,
    BatchRunResponse,
    RunRequest,
    RunResponse,
)
from runtimes.models import RunLimits, RunSpec

#: Memory given to a run that names none, unless the tenant's maximum is lower.
DEFAULT_MEMORY_MB = 512


def to_spec(body: RunRequest, max_memory_mb: int) -> RunSpec:
    memory = body.memory_limit_mb or min(DEFAULT_MEMORY_MB, max_memory_mb)
    return RunSpec(
        language=body.language,
        code=body.code,
        stdin=body.stdin,
        files=body.files,
        fetch_files=body.fetch_files,
        limits=RunLimits(
            compile_timeout_s=body.compile_timeout,
            run_timeout_s=body.run_timeout,
            memory_mb=memory,
        ),
    )


@endpoint(
    "POST",
    "/v1/run",
    summary="Run code once and wait for the result",
    tags=["run"],
    body=RunRequest,
    response=RunResponse,
)
async def run(call: Call) -> RunResponse:
    principal = call.tenant
    spec = to_spec(call.body, principal.quota.max_memory_mb)
    row, result = await call.services.executor.run(principal, spec)
    return run_response(row, result)


@endpoint(
    "POST",
    "/v1/run/batch",
    summary="Run many, concurrently; results in request order",
    tags=["run"],
    body=BatchRunRequest,
    response=BatchRunResponse,
)
async def run_batch(call: Call) -> BatchRunResponse:
    principal = call.tenant
    body: BatchRunRequest = call.body
    executor = call.services.executor

    async def one(request: RunRequest) -> BatchItem:
        try:
            spec = to_spec(request, principal.quota.max_memory_mb)
            row, result = await executor.run(principal, spec)
        except CorralError as exc:  # each item is admitted and answered on its own
            return BatchItem(error=BatchItemError(code=exc.code, message=exc.message))
        return BatchItem(result=run_response(row, result))

    items = await asyncio.gather(*(one(r) for r in body.runs))
    return BatchRunResponse(results=list(items))


endpoints = [run, run_batch]
