"""Bodies of the function registry and invocation endpoints (``/v1/functions``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, JsonValue, RootModel

from app.schemas.common import Strict
from app.schemas.run import Timings

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
ALIAS_PATTERN = r"^[A-Za-z][A-Za-z0-9_.-]{0,31}$"


class FunctionLimits(Strict):
    timeout_s: float = Field(10.0, gt=0, le=3600, description="run time limit, seconds")
    memory_mb: int | None = Field(
        None, ge=16, le=1_048_576, description="default: the tenant's max_memory_mb, capped at 512"
    )


class FunctionManifest(Strict):
    """What a version is, apart from its name and artifact (the multipart ``manifest``)."""

    language: str = Field(
        min_length=1,
        max_length=32,
        examples=["python"],
        description="python | nodejs | wasm-python | wasm-javascript | wasm (a WASI module)",
    )
    entry_point: str = Field(
        "handler",
        min_length=1,
        max_length=128,
        description="the function called with the input (ignored for wasm: _start runs)",
    )
    input_schema: dict[str, Any] = Field(
        default_factory=dict, description="JSON Schema (Draft 2020-12) of the input; {} = any"
    )
    limits: FunctionLimits = Field(default_factory=lambda: FunctionLimits())


class FunctionCreate(FunctionManifest):
    """Register a function, or a new version of it. Exactly one of ``code`` (source text)
    and ``module_base64`` (a ``.wasm`` module, for language ``wasm``)."""

    name: str = Field(pattern=NAME_PATTERN, examples=["word-count"])
    code: str | None = Field(None, description="source text (at most 1 MiB)")
    module_base64: str | None = Field(None, description="base64 of a .wasm module (≤ 16 MiB)")


class VersionOut(BaseModel):
    version: int
    content_hash: str = Field(description="SHA-256 of the code or module")
    language: str
    entry_point: str
    input_schema: dict[str, Any]
    limits: dict[str, Any]
    created_at: datetime


class FunctionOut(BaseModel):
    name: str
    language: str = Field(description="language of the latest version")
    aliases: dict[str, int] = Field(description="alias -> version; 'latest' is the newest")
    created_at: datetime


class FunctionDetail(FunctionOut):
    latest: VersionOut


class RegisterResponse(BaseModel):
    function: FunctionOut
    version: VersionOut
    created: bool = Field(
        description="false when the upload was identical to the latest version, returned as is"
    )


class FunctionList(BaseModel):
    functions: list[FunctionOut]


class VersionList(BaseModel):
    versions: list[VersionOut] = Field(description="newest first")


class AliasSet(Strict):
    version: int = Field(ge=1)


class InvokeQuery(Strict):
    version: str | None = Field(
        None, max_length=32, description="a version number or alias; default: latest"
    )


class FunctionInput(RootModel[JsonValue]):
    """The input: any JSON value, checked against the function's input schema."""


class BatchInvokeRequest(Strict):
    inputs: list[JsonValue] = Field(min_length=1, max_length=256)


class FunctionError(BaseModel):
    code: str = Field(
        description="bad_function_output | function_error | time_limit | memory_limit | "
        "output_limit | killed | start_error | platform_error, or (batch items) the "
        "refusal's API error code"
    )
    message: str
    details: dict[str, Any] | None = None


class InvokeResponse(BaseModel):
    invocation_id: str
    function: str
    version: int
    status: str = Field(description="succeeded | failed (the function failed) | errored")
    output: JsonValue = None
    error: FunctionError | None = None
    logs: str = Field("", description="what the function wrote to stderr (capped)")
    logs_truncated: bool = False
    timings: Timings = Field(default_factory=Timings)
    omitted_outputs: dict[str, str] = Field(
        default_factory=dict,
        description="`output` when this answer leaves out a large output, and why: "
        "`expired` (kept for the blob retention only) or `batch_response_cap` (a batch "
        "answer ran out of room; GET the invocation's result for it)",
    )


class AcceptedResponse(BaseModel):
    invocation_id: str
    function: str
    version: int
    status: str = "queued"
    poll: str = Field(description="the invocation record: GET this URL")
    result: str = Field(description="the function-shaped result: GET this URL")


class BatchInvokeItem(BaseModel):
    """One input of a batch: its result, or why it was not run."""

    result: InvokeResponse | None = None
    error: FunctionError | None = None


class BatchInvokeResponse(BaseModel):
    function: str
    version: int
    results: list[BatchInvokeItem]
