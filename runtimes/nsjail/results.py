"""Turning the zygote's stage reports into ``StageResult``/``RunResult``.

Status rules, first match wins:

* the stage could not be started (exec failed, rlimit refused) -> ERROR
* the zygote's wall-clock deadline fired -> TIME_LIMIT
* SIGXCPU, or SIGKILL once the CPU used reached RLIMIT_CPU -> TIME_LIMIT
* the jail's cgroup OOM-kill counter went up during the stage -> MEMORY_LIMIT
* Python raised MemoryError, or the language's out-of-memory text is on stderr of a
  failed process (``std::bad_alloc``, ``java.lang.OutOfMemoryError``, V8 heap) -> MEMORY_LIMIT
* SIGXFSZ (RLIMIT_FSIZE) -> OUTPUT_LIMIT
* any other signal -> KILLED
* otherwise FINISHED with the exit code
"""

from __future__ import annotations

import signal
from typing import Any

from runtimes.nsjail.languages import StagePlan
from wire.execution import RunResult, StageResult, StageStatus


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def classify(
    report: dict[str, Any], plan: StagePlan, *, oom_killed: bool
) -> tuple[StageStatus, str | None]:
    sig: int | None = report.get("signal")
    exit_code: int | None = report.get("exit_code")
    cpu_ms = float(report.get("cpu_ms") or 0.0)
    if report.get("error"):
        return StageStatus.ERROR, f"could not start the {plan.name} stage: {report['error']}"
    if report.get("timed_out"):
        return (
            StageStatus.TIME_LIMIT,
            f"wall-clock limit of {plan.timeout_s:g}s exceeded; all processes were killed",
        )
    cpu_limit_s = int(report.get("cpu_limit_s") or 0)
    if sig == signal.SIGXCPU or (
        sig == signal.SIGKILL and cpu_limit_s and cpu_ms >= cpu_limit_s * 1000
    ):
        return StageStatus.TIME_LIMIT, f"CPU-time limit of {cpu_limit_s}s exceeded"
    if oom_killed:
        return (
            StageStatus.MEMORY_LIMIT,
            f"memory limit of {plan.memory_mb} MB exceeded: killed by the out-of-memory killer",
        )
    if report.get("memory_error"):
        return (
            StageStatus.MEMORY_LIMIT,
            f"memory limit of {plan.memory_mb} MB exceeded (MemoryError)",
        )
    failed = sig is not None or exit_code != 0
    stderr = str(report.get("stderr", ""))
    if failed and any(marker in stderr for marker in plan.oom_markers):
        return (
            StageStatus.MEMORY_LIMIT,
            f"memory limit of {plan.memory_mb} MB exceeded (out of memory)",
        )
    if sig == signal.SIGXFSZ:
        return (
            StageStatus.OUTPUT_LIMIT,
            f"file size limit of {plan.max_file_bytes} bytes exceeded (SIGXFSZ)",
        )
    if sig is not None:
        return StageStatus.KILLED, f"killed by {_signal_name(sig)}"
    return StageStatus.FINISHED, None


def stage_result(
    report: dict[str, Any], plan: StagePlan, *, oom_killed: bool, max_output: int
) -> StageResult:
    status, message = classify(report, plan, oom_killed=oom_killed)
    stdout_truncated = bool(report.get("stdout_truncated"))
    stderr_truncated = bool(report.get("stderr_truncated"))
    if message is None and (stdout_truncated or stderr_truncated):
        message = f"output truncated to {max_output} bytes per stream"
    return StageResult(
        status=status,
        exit_code=report.get("exit_code"),
        signal=report.get("signal"),
        stdout=str(report.get("stdout", "")),
        stderr=str(report.get("stderr", "")),
        stdout_truncated=stdout_truncated,
        stderr_truncated=stderr_truncated,
        wall_ms=float(report.get("wall_ms") or 0.0),
        cpu_ms=report.get("cpu_ms"),
        peak_memory_kb=report.get("maxrss_kb"),
        message=message,
    )


def run_result(
    reply: dict[str, Any], plans: list[StagePlan], *, oom_stages: set[str], max_output: int
) -> RunResult:
    """The RunResult of one zygote reply (timings are filled in by the caller)."""
    if reply.get("input_error"):
        return RunResult(
            run=StageResult(status=StageStatus.ERROR, message=str(reply["input_error"]))
        )
    reports: list[dict[str, Any]] = list(reply.get("stages", []))
    by_name = {plan.name: plan for plan in plans}
    stages: dict[str, StageResult] = {}
    for report in reports:
        plan = by_name[report["name"]]
        stages[plan.name] = stage_result(
            report, plan, oom_killed=plan.name in oom_stages, max_output=max_output
        )
    notes = [str(note) for note in reply.get("fetch_notes", [])]
    if notes and "run" in stages:
        run = stages["run"]
        text = "; ".join(notes)
        run.message = f"{run.message}; {text}" if run.message else text
    cpu = [s.cpu_ms for s in stages.values() if s.cpu_ms is not None]
    peaks = [s.peak_memory_kb for s in stages.values() if s.peak_memory_kb is not None]
    return RunResult(
        compile=stages.get("compile"),
        run=stages.get("run"),
        files=dict(reply.get("files", {})),
        cpu_ms=sum(cpu) if cpu else None,
        peak_memory_kb=max(peaks) if peaks else None,
    )
