"""Mapping how a guest ended (an ``Outcome``) to a ``StageResult``.

Rules, first match wins:

* the host gave up waiting (backstop past the deadline) -> TIME_LIMIT
* the instance could not be created: over the memory limit -> MEMORY_LIMIT, else ERROR
* aborted by the host while closing -> KILLED
* epoch deadline (``interrupt``), the CPU-time limit or wall backstop of a CPU-basis
  call, fuel exhausted -> TIME_LIMIT
* a failed run (trap or non-zero exit) whose stderr has the language's out-of-memory text
  (``MemoryError``, QuickJS ``out of memory``), or whose memory ended within a few pages of
  the limit (``memory.grow`` refused, then the program gave up) -> MEMORY_LIMIT
* any other trap (``unreachable``, out-of-bounds access, stack overflow) -> KILLED, with
  the trap in ``message``
* an exit status WASI cannot carry (126 and up) -> FINISHED with no exit code
* otherwise FINISHED with the exit code (``proc_exit(n)`` is exit code n)
"""

from __future__ import annotations

from wasmtime import TrapCode

from node.fncall.wasm.instance import CallLimits, Outcome
from node.fncall.wasm.output import Capture
from wire.execution import CONTENDED_BELOW_CORES, StageResult, StageStatus

MIB = 1024 * 1024
#: Memory this close to the cap counts as exhausted for a failed run.
NEAR_LIMIT_BYTES = 2 * MIB
_TIME_TRAPS = {TrapCode.INTERRUPT, TrapCode.OUT_OF_FUEL}


def classify(
    outcome: Outcome | None,
    limits: CallLimits,
    *,
    stderr_text: str,
    oom_markers: tuple[str, ...],
) -> tuple[StageStatus, int | None, str | None]:
    """(status, exit code, message) of one run; ``outcome`` None: abandoned by the host."""
    mb = limits.memory_bytes // MIB
    if outcome is None:
        return (
            StageStatus.TIME_LIMIT,
            None,
            f"time limit of {limits.wall_limit_s:g}s exceeded; the guest did not stop and was "
            "abandoned",
        )
    if outcome.error is not None:
        if "memory" in outcome.error and "limit" in outcome.error:
            return StageStatus.MEMORY_LIMIT, None, f"memory limit of {mb} MB: {outcome.error}"
        return StageStatus.ERROR, None, f"could not start the module: {outcome.error}"
    if outcome.cancelled:
        return StageStatus.KILLED, None, "stopped because the wasm runtime is shutting down"
    if outcome.limit_hit == "cpu":
        return StageStatus.TIME_LIMIT, None, f"CPU time limit of {limits.timeout_s:g}s exceeded"
    if outcome.limit_hit == "wall":
        return (
            StageStatus.TIME_LIMIT,
            None,
            f"wall-clock limit of {limits.wall_limit_s:g}s exceeded "
            f"(CPU time limit {limits.timeout_s:g}s)",
        )
    if outcome.trap_code in _TIME_TRAPS:
        if outcome.trap_code is TrapCode.OUT_OF_FUEL:
            return StageStatus.TIME_LIMIT, None, f"fuel budget of {limits.fuel} exhausted"
        return StageStatus.TIME_LIMIT, None, f"time limit of {limits.wall_limit_s:g}s exceeded"
    if outcome.trap is not None and "invalid exit status" in outcome.trap:
        return StageStatus.FINISHED, None, "exited with a status WASI cannot carry (>= 126)"
    trapped = outcome.trap is not None
    failed = trapped or outcome.exit_code != 0
    tail = stderr_text[-2000:]
    near_limit = (
        outcome.memory_bytes is not None
        and outcome.memory_bytes >= limits.memory_bytes - NEAR_LIMIT_BYTES
    )
    if failed and (near_limit or any(marker in tail for marker in oom_markers)):
        return StageStatus.MEMORY_LIMIT, outcome.exit_code, f"memory limit of {mb} MB exceeded"
    if trapped:
        return StageStatus.KILLED, None, f"wasm trap: {outcome.trap}"
    return StageStatus.FINISHED, outcome.exit_code, None


def stage_result(
    outcome: Outcome | None,
    limits: CallLimits,
    *,
    stdout: Capture,
    stderr: Capture,
    oom_markers: tuple[str, ...],
    wall_ms: float,
) -> StageResult:
    stderr_text = stderr.text()
    status, exit_code, message = classify(
        outcome, limits, stderr_text=stderr_text, oom_markers=oom_markers
    )
    if message is None and (stdout.truncated or stderr.truncated):
        message = f"output truncated to {limits.max_output} bytes per stream"
    peak = outcome.memory_bytes if outcome is not None else None
    stage = StageResult(
        status=status,
        exit_code=exit_code,
        stdout=stdout.text(),
        stderr=stderr_text,
        stdout_truncated=stdout.truncated,
        stderr_truncated=stderr.truncated,
        wall_ms=wall_ms,
        cpu_ms=outcome.cpu_ms if outcome is not None else None,
        peak_memory_kb=peak // 1024 if peak is not None else None,
        message=message,
    )
    judge(stage, outcome)
    return stage


def judge(stage: StageResult, outcome: Outcome | None) -> None:
    """Set ``contended`` when the stage hit its wall-clock limit with little CPU
    (``StageResult.judge_contention``). Not for a CPU-time limit or fuel (exact verdicts),
    and not when the guest spent that time in sleeps it asked for."""
    if outcome is not None and (
        outcome.limit_hit == "cpu" or outcome.trap_code is TrapCode.OUT_OF_FUEL
    ):
        return
    stage.judge_contention()
    slept = outcome.slept_ms if outcome is not None else 0.0
    waited = (
        stage.cpu_ms is not None and stage.cpu_ms + slept >= CONTENDED_BELOW_CORES * stage.wall_ms
    )
    if stage.contended and slept and waited:
        stage.contended = False
