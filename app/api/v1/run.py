"""``POST /v1/run``: run source code once on a jailed, pre-initialised worker."""

from __future__ import annotations

import asyncio

from app.api.v1.present import run_response
from app.auth.principal import Principal
from app.errors import CorralError
from app.http.endpoint import Call, endpoint
from app.invocations import projection
from app.invocations.limits import limits_for
from app.schemas.run import (
    BatchItem,
    BatchItemError,
    BatchRunRequest,
    BatchRunResponse,
    RunRequest,
    RunResponse,
)
from wire.execution import RunSpec


def to_spec(body: RunRequest, principal: Principal) -> RunSpec:
    """The execution a request asks for; a limit over the tenant's quota is refused."""
    return RunSpec(
        language=body.language,
        code=body.code,
        stdin=body.stdin,
        files=body.files,
        fetch_files=body.fetch_files,
        limits=limits_for(
            principal.quota,
            memory_mb=body.memory_limit_mb,
            run_timeout_s=body.run_timeout,
            compile_timeout_s=body.compile_timeout,
        ),
    )


@endpoint(
    "POST",
    "/v1/run",
    summary="Run code once and wait for the result",
    tags=["run"],
    body=RunRequest,
    response=RunResponse,
    errors=(429, 504),
)
async def run(call: Call) -> RunResponse:
    principal = call.tenant
    row = await call.services.invocations.run(principal, to_spec(call.body, principal))
    return run_response(row, await projection.load(call.services.sessions, row))


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
    invocations = call.services.invocations
    sessions = call.services.sessions
    budget = projection.ResponseBudget(call.services.settings.max_batch_response_bytes)

    async def one(request: RunRequest) -> BatchItem:
        try:
            row = await invocations.run(principal, to_spec(request, principal))
        except CorralError as exc:  # each item is admitted and answered on its own
            return BatchItem(error=BatchItemError(code=exc.code, message=exc.message))
        return BatchItem(result=run_response(row, await projection.load(sessions, row, budget)))

    items = await asyncio.gather(*(one(r) for r in body.runs))
    return BatchRunResponse(results=list(items))


endpoints = [run, run_batch]
