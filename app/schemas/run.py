"""Bodies of ``POST /v1/run``: source code in a language, run once on a jailed worker."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from app.schemas.common import Strict
from wire.execution import StageResult


class RunRequest(Strict):
    language: str = Field(min_length=1, max_length=32, examples=["python"])
    code: str = Field(max_length=4 * 1024 * 1024, examples=["print(1)"])
    stdin: str = Field("", max_length=8 * 1024 * 1024)
    files: dict[str, str] = Field(
        default_factory=dict, description="path in the work dir -> base64 content"
    )
    fetch_files: list[str] = Field(default_factory=list, max_length=64)
    compile_timeout: float = Field(10.0, gt=0, le=3600, description="seconds")
    run_timeout: float = Field(10.0, gt=0, le=3600, description="seconds")
    memory_limit_mb: int | None = Field(
        None, ge=16, le=1_048_576, description="default: the tenant's max_memory_mb, capped at 512"
    )


class Timings(BaseModel):
    queue_ms: float | None = None
    setup_ms: float | None = None
    exec_ms: float | None = None
    teardown_ms: float | None = None
    total_ms: float | None = None
    cpu_ms: float | None = None
    peak_memory_kb: int | None = None


class RunResponse(BaseModel):
    invocation_id: str
    status: str = Field(description="succeeded | failed (the code failed) | errored (platform)")
    error: str | None = None
    attempts: int = 1
    contended: bool = Field(
        False,
        description="a stage hit its wall-clock limit while starved of CPU by other work: "
        "a time limit that says little about the code (see the stage's cpu_ms)",
    )
    compile: StageResult | None = None
    run: StageResult | None = None
    files: dict[str, str] = Field(default_factory=dict)
    timings: Timings = Field(default_factory=Timings)
    created_at: datetime | None = None
    omitted_outputs: dict[str, str] = Field(
        default_factory=dict,
        description="large parts (run.stdout, compile.stderr, files/<path>) this answer "
        "shows only the beginning of (a file: not at all), and why: `expired` (kept for "
        "the blob retention only), `batch_response_cap` (a batch answer ran out of room) or "
        "`listed` (a list shows previews); GET /v1/invocations/{id} has them whole until "
        "they expire",
    )


class BatchRunRequest(Strict):
    runs: list[RunRequest] = Field(min_length=1, max_length=256)


class BatchItemError(BaseModel):
    code: str
    message: str


class BatchItem(BaseModel):
    """One run of a batch: its result, or why it was not run (e.g. ``rate_limited``)."""

    result: RunResponse | None = None
    error: BatchItemError | None = None


class BatchRunResponse(BaseModel):
    results: list[BatchItem]
