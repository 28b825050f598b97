"""What an execution asks for and what it returns: the wire types of one execution.

These travel as JSON between gateway and node (never pickle), so they are pydantic
models with only plain fields.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: A stage that hit its wall-clock limit while getting less than this share of one core
#: (CPU time over wall time) was starved by others, not slow: it is reported ``contended``.
CONTENDED_BELOW_CORES = 0.5
#: ... and, where the backend measures it (``wait_ms``), waited for a CPU at least this
#: share of that time: a program that slept or blocked past its limit is not contended.
CONTENDED_WAIT_SHARE = 0.25


class StageStatus(StrEnum):
    """How one stage (compile or run) ended."""

    FINISHED = "finished"  #: exited on its own; see exit_code
    TIME_LIMIT = "time_limit"  #: wall-clock or CPU-time limit reached, killed
    MEMORY_LIMIT = "memory_limit"  #: memory limit reached, killed
    OUTPUT_LIMIT = "output_limit"  #: wrote more than the file-size limit
    KILLED = "killed"  #: ended by a signal for another reason
    ERROR = "error"  #: could not be started (the platform's fault, not the code's)


class RunLimits(BaseModel):
    """Limits of one execution. Time is judged on wall-clock time by default; with
    ``time_basis="cpu"`` each stage's timeout is a limit on its CPU time, and the stage is
    stopped by wall-clock time only at ``wall_backstop_factor`` times its timeout (an
    exact verdict for code that merely waited for a core, at the cost of latency)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compile_timeout_s: float = Field(10.0, gt=0)
    run_timeout_s: float = Field(10.0, gt=0)
    time_basis: Literal["wall", "cpu"] = "wall"
    wall_backstop_factor: float = Field(3.0, ge=1.0, le=10.0)

    def wall_limit(self, timeout_s: float) -> float:
        """The wall-clock limit of a stage whose timeout is ``timeout_s``."""
        return timeout_s * (self.wall_backstop_factor if self.time_basis == "cpu" else 1.0)

    @property
    def wall_seconds(self) -> float:
        """The longest both stages can take by the clock."""
        return self.wall_limit(self.compile_timeout_s) + self.wall_limit(self.run_timeout_s)

    memory_mb: int = Field(512, ge=16)
    compile_memory_mb: int = Field(1024, ge=16, description="memory of a compile stage")
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
    artifact: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="SHA-256 of a tool function's artifact (its WebAssembly module), which "
        "the node takes from its cache or fetches by digest (ARTIFACT_PATH) instead of "
        "files; set by the gateway only, never from a request body",
    )


#: Where a node fetches a function artifact it lacks, from the control plane (node token).
ARTIFACT_PATH = "/internal/artifacts/{tenant_id}/{digest}"


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
    contended: bool = Field(
        False,
        description="the stage hit its wall-clock limit while it got less than "
        "CONTENDED_BELOW_CORES of a core: others took the CPU, the code may be correct",
    )
    wait_ms: float | None = Field(
        None,
        description="time the stage's processes were ready to run but waited for a CPU, "
        "measured when a wall-clock limit fires (where the backend can)",
    )
    peak_memory_kb: int | None = None
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is StageStatus.FINISHED and self.exit_code == 0

    def judge_contention(self) -> StageResult:
        """Set ``contended`` for a wall-clock time limit hit with under
        ``CONTENDED_BELOW_CORES`` of a core (needs ``cpu_ms``) and, when ``wait_ms`` is
        known, with at least ``CONTENDED_WAIT_SHARE`` of the time spent waiting for a CPU;
        returns self. Only for a wall-clock verdict: a CPU-time limit is exact."""
        if self.status is StageStatus.TIME_LIMIT and self.cpu_ms is not None and self.wall_ms > 0:
            starved = self.cpu_ms < CONTENDED_BELOW_CORES * self.wall_ms
            waited = self.wait_ms is None or self.wait_ms >= CONTENDED_WAIT_SHARE * self.wall_ms
            self.contended = starved and waited
        return self


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
    def contended(self) -> bool:
        return any(s is not None and s.contended for s in (self.compile, self.run))

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
