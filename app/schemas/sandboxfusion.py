"""SandboxFusion's ``/run_code`` request and response, field for field.

RL frameworks (verl's reward client, the ``sandbox-fusion`` PyPI client) send these
unchanged. The shapes follow SandboxFusion's public API; the code is Corral's own.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class SfRunStatus(StrEnum):
    SUCCESS = "Success"  #: every stage finished with return code 0
    FAILED = "Failed"  #: a stage failed: non-zero code, time limit, killed
    SANDBOX_ERROR = "SandboxError"  #: the platform failed; the code's outcome is unknown


class SfCommandStatus(StrEnum):
    FINISHED = "Finished"
    ERROR = "Error"
    TIME_LIMIT_EXCEEDED = "TimeLimitExceeded"


class SfRunCodeRequest(BaseModel):
    # Lenient like the original: clients send extra keys (e.g. "extra") and nulls.
    model_config = ConfigDict(extra="ignore")

    code: str = Field(max_length=4 * 1024 * 1024, examples=['print("hello")'])
    language: str = Field(min_length=1, max_length=32, examples=["python"])
    compile_timeout: float = Field(10, gt=0, le=3600)
    run_timeout: float = Field(10, gt=0, le=3600)
    memory_limit_MB: int = Field(-1, ge=-1, description="-1: the default; capped at the quota")
    stdin: str | None = Field(None, max_length=8 * 1024 * 1024)
    files: dict[str, str | None] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list, max_length=64)


class SfCommandRunResult(BaseModel):
    status: SfCommandStatus
    execution_time: float | None = Field(None, description="seconds")
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None
    # Corral's additions (clients that do not know them ignore them):
    cpu_time: float | None = Field(None, description="CPU seconds the stage used")
    contended: bool = Field(
        False,
        description="TimeLimitExceeded while the stage got well under a core (other work "
        "took the CPU): the code may be correct",
    )


class SfRunCodeResponse(BaseModel):
    status: SfRunStatus
    message: str = ""
    compile_result: SfCommandRunResult | None = None
    run_result: SfCommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
    capped: dict[str, dict[str, float]] | None = Field(
        None,
        description="requested limits lowered to the tenant's quota: name -> requested, granted",
    )
