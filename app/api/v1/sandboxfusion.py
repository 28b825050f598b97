"""SandboxFusion compatibility: ``POST /run_code`` and ``GET /v1/ping``.

Keyless requests (verl and the SandboxFusion clients send no key) act as the configured
default tenant, which the embedded default enables for loopback clients only. A
requested limit over the tenant's quota is capped, not refused, because these clients
treat any non-200 answer as a failed reward.
"""

from __future__ import annotations

from pydantic import RootModel

from app.http.endpoint import Call, endpoint
from app.invocations import projection
from app.invocations.limits import grant
from app.schemas.sandboxfusion import (
    SfCommandRunResult,
    SfCommandStatus,
    SfRunCodeRequest,
    SfRunCodeResponse,
    SfRunStatus,
)
from wire.execution import RunResult, RunSpec, StageResult, StageStatus


class Pong(RootModel[str]):
    pass


@endpoint(
    "GET",
    "/v1/ping",
    summary='SandboxFusion liveness: answers "pong"',
    tags=["sandboxfusion"],
    auth="none",
    response=Pong,
)
async def ping(call: Call) -> Pong:
    return Pong("pong")


@endpoint(
    "POST",
    "/run_code",
    summary="Run code (SandboxFusion-compatible)",
    tags=["sandboxfusion"],
    auth="tenant_or_default",
    body=SfRunCodeRequest,
    response=SfRunCodeResponse,
    errors=(429, 504),
)
async def run_code(call: Call) -> SfRunCodeResponse:
    body: SfRunCodeRequest = call.body
    principal = call.tenant
    granted = grant(
        principal.quota,
        memory_mb=body.memory_limit_MB if body.memory_limit_MB > 0 else None,
        run_timeout_s=body.run_timeout,
        compile_timeout_s=body.compile_timeout,
        on_excess="cap",
    )
    spec = RunSpec(
        language=body.language,
        code=body.code,
        stdin=body.stdin or "",
        files={k: v for k, v in body.files.items() if v is not None},
        fetch_files=body.fetch_files,
        limits=granted.limits,
    )
    row = await call.services.invocations.run(principal, spec)
    loaded = await projection.load(call.services.sessions, row)
    response = to_response(loaded.result, invocation_id=row.id, node_id=row.node_id)
    response.capped = granted.capped or None
    return response


def to_response(
    result: RunResult | None, *, invocation_id: str, node_id: str | None
) -> SfRunCodeResponse:
    if result is None or result.error is not None:
        reason = result.error if result is not None else "no result was stored"
        return SfRunCodeResponse(
            status=SfRunStatus.SANDBOX_ERROR,
            message=f"{reason} (invocation {invocation_id})",
            executor_pod_name=node_id,
        )
    return SfRunCodeResponse(
        status=SfRunStatus.SUCCESS if result.succeeded else SfRunStatus.FAILED,
        message="" if result.succeeded else _failure_message(result),
        compile_result=_command(result.compile),
        run_result=_command(result.run),
        executor_pod_name=node_id,
        files=result.files,
    )


def _command(stage: StageResult | None) -> SfCommandRunResult | None:
    if stage is None:
        return None
    if stage.status is StageStatus.TIME_LIMIT:
        status, code = SfCommandStatus.TIME_LIMIT_EXCEEDED, stage.exit_code
    elif stage.status is StageStatus.ERROR:
        status, code = SfCommandStatus.ERROR, stage.exit_code
    elif stage.status is StageStatus.FINISHED:
        status, code = SfCommandStatus.FINISHED, stage.exit_code
    else:  # killed by a limit or a signal: finished, with the shell's 128+signal code
        status = SfCommandStatus.FINISHED
        code = stage.exit_code if stage.exit_code is not None else 128 + (stage.signal or 9)
    stderr = stage.stderr
    if stage.message and stage.status is not StageStatus.FINISHED:
        stderr += (
            "" if stderr.endswith("\n") or not stderr else "\n"
        ) + f"[corral] {stage.message}\n"
    return SfCommandRunResult(
        status=status,
        execution_time=stage.wall_ms / 1000.0,
        return_code=code,
        stdout=stage.stdout,
        stderr=stderr,
        cpu_time=stage.cpu_ms / 1000.0 if stage.cpu_ms is not None else None,
        contended=stage.contended,
    )


def _failure_message(result: RunResult) -> str:
    for name, stage in (("compile", result.compile), ("run", result.run)):
        if stage is not None and not stage.ok:
            detail = stage.message or f"exit code {stage.exit_code}"
            return f"{name} stage {stage.status}: {detail}"
    return "failed"


endpoints = [ping, run_code]
