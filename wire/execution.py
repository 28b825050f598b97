"""What an execution asks for and what it returns: the wire types of one execution.

These travel as JSON between gateway and node (never pickle), so they are pydantic
models with only plain fields.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class StageStatus(StrEnum):
    """How one stage (compile or run) ended."""

    FINISHED = "finished"  #: exited on its own; see exit_code
    TIME_LIMIT = "time_limit"  #: wall-clock or CPU-time limit reached, killed
    MEMORY_LIMIT = "memory_limit"  #: memory limit reached, killed
    OUTPUT_LIMIT = "output_limit"  #: wrote more than the file-size limit
    KILLED = "killed"  #: ended by a signal for another reason
    ERROR = "error"  #: could not be started (the platform's fault, not the code's)


class RunLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    compile_timeout_s: float = Field(10.0, gt=0)
    run_timeout_s: float = Field(10.0, gt=0)
    memory_mb: int = Field(512, ge=16)
    max_output_bytes: int = Field(1024 * 1024, ge=1024)
    max_processes: int = Field(64, ge=1)
    max_file_bytes: int = Field(64 * 1024 * 1024, ge=1024)


class RunSpec(BaseModel):
    """One stateless execution: source code in a language, run once."""

    model_config = ConfigDict(extra="forbid")

    language: str
    code: str
    stdin: str = ""
    files: dict[str, str] = Field(
        default_factory=dict, description="path relative to the work dir -> base64 content"
    )
    fetch_files: list[str] = Field(default_factory=list)
    limits: RunLimits = Field(default_factory=RunLimits)


class StageResult(BaseModel):
    status: StageStatus
    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_ms: float = 0.0
    cpu_ms: float | None = None
    peak_memory_kb: int | None = None
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is StageStatus.FINISHED and self.exit_code == 0


class RunResult(BaseModel):
    """What a backend returns for a RunSpec."""

    compile: StageResult | None = None
    run: StageResult | None = None
    files: dict[str, str] = Field(default_factory=dict, description="fetched files, base64")
    setup_ms: float = 0.0
    exec_ms: float = 0.0
    teardown_ms: float = 0.0
    cpu_ms: float | None = None
    peak_memory_kb: int | None = None
    error: str | None = Field(None, description="set when the platform, not the code, failed")

    @property
    def succeeded(self) -> bool:
        stages = [s for s in (self.compile, self.run) if s is not None]
        return self.error is None and bool(stages) and all(s.ok for s in stages)

    @property
    def outcome(self) -> str:
        """``succeeded``, ``failed`` (the code failed) or ``errored`` (the platform did)."""
        if self.error is not None:
            return "errored"
        return "succeeded" if self.succeeded else "failed"


class LanguageInfo(BaseModel):
    name: str
    runtime: str
    version: str | None = None
    compiled: bool = False
