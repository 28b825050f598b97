"""Turning the zygote's stage reports into ``StageResult``/``RunResult``.

A status the platform reports is judged from what the jail's code cannot forge: what
PID 1 and the kernel saw (signals, the cgroup's OOM-kill counter and CPU time, peak
memory), never from what the code wrote. Status rules, first match wins:

* the stage could not be started before any of the call's code ran (the toolchain could
  not be executed, a set-up step failed) -> ERROR
* a later stage could not be started because of what an earlier stage's code did (it
  removed the work dir, built a ``./main`` that cannot run, killed the jail's template)
  -> FINISHED with exit code 126/127, and the reason as message
* the stage's processes used more CPU time than its CPU-time limit (``time_basis
  "cpu"``; PID 1 stops them at the limit, and the cgroup's count is checked again) ->
  TIME_LIMIT
* the zygote's wall-clock deadline fired -> TIME_LIMIT, and ``contended`` when the stage
  got under half a core meanwhile and its threads waited on a run queue for a quarter of
  the time (read by PID 1 before the kill; ``StageResult.judge_contention``): a program
  that slept past its limit is not contended
* SIGXCPU, or SIGKILL once the stage process's CPU time reached RLIMIT_CPU -> TIME_LIMIT
* the jail's cgroup OOM-kill counter went up during the stage while the jail never
  reached its own limit (the node's jails together reached their parent's) -> KILLED,
  and the message says so
* the jail's cgroup OOM-kill counter went up during the stage -> MEMORY_LIMIT
* a failed process with the language's out-of-memory text on stderr (``MemoryError``,
  ``std::bad_alloc``, ``java.lang.OutOfMemoryError``, V8's heap message) whose peak
  resident memory reached half the stage's limit -> MEMORY_LIMIT (the text alone is the
  code's to print; the memory it must really have used)
* SIGXFSZ (RLIMIT_FSIZE) -> OUTPUT_LIMIT
* any other signal -> KILLED
* otherwise FINISHED with the exit code
"""

from __future__ import annotations

import signal
from typing import Any, NamedTuple

from node.fncall.nsjail.languages import StagePlan
from wire.execution import RunResult, StageResult, StageStatus

#: peak resident memory, as a share of the stage's limit, that makes an out-of-memory
#: message on stderr believable
MEMORY_EVIDENCE = 0.5


class Verdict(NamedTuple):
    status: StageStatus
    message: str | None
    #: the wall-clock deadline ended the stage (so contention is judged)
    wall_clock: bool = False


def node_oom_message(memory_mb: int) -> str:
    return (
        "killed by the out-of-memory killer: the node's jails together ran out of memory "
        f"while this one stayed within its own limit of {memory_mb} MB"
    )


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def classify(
    report: dict[str, Any],
    plan: StagePlan,
    *,
    oom_killed: bool,
    cpu_ms: float | None = None,
    node_oom: bool = False,
) -> Verdict:
    """The status of one stage. ``cpu_ms``: the CPU time of all its processes (the
    cgroup's), when known."""
    sig: int | None = report.get("signal")
    exit_code: int | None = report.get("exit_code")
    process_cpu_ms = float(report.get("cpu_ms") or 0.0)
    if report.get("error"):
        return Verdict(
            StageStatus.ERROR, f"could not start the {plan.name} stage: {report['error']}"
        )
    if report.get("start_failure"):
        return Verdict(
            StageStatus.FINISHED,
            f"could not start the {plan.name} stage: {report['start_failure']}",
        )
    if plan.cpu_limit_s is not None and (
        report.get("cpu_exceeded") or (cpu_ms is not None and cpu_ms >= plan.cpu_limit_s * 1000)
    ):
        return Verdict(
            StageStatus.TIME_LIMIT,
            f"CPU-time limit of {plan.cpu_limit_s:g}s exceeded; all processes were killed",
        )
    if report.get("timed_out"):
        return Verdict(
            StageStatus.TIME_LIMIT,
            f"wall-clock limit of {plan.wall_s:g}s exceeded; all processes were killed",
            wall_clock=True,
        )
    cpu_limit_s = int(report.get("cpu_limit_s") or 0)
    if sig == signal.SIGXCPU or (
        sig == signal.SIGKILL and cpu_limit_s and process_cpu_ms >= cpu_limit_s * 1000
    ):
        return Verdict(StageStatus.TIME_LIMIT, f"CPU-time limit of {cpu_limit_s}s exceeded")
    if node_oom:
        return Verdict(StageStatus.KILLED, node_oom_message(plan.memory_mb))
    if oom_killed:
        return Verdict(
            StageStatus.MEMORY_LIMIT,
            f"memory limit of {plan.memory_mb} MB exceeded: killed by the out-of-memory killer",
        )
    failed = sig is not None or exit_code != 0
    stderr = str(report.get("stderr", ""))
    peak_kb = int(report.get("maxrss_kb") or 0)
    if (
        failed
        and any(marker in stderr for marker in plan.oom_markers)
        and peak_kb >= plan.memory_mb * 1024 * MEMORY_EVIDENCE
    ):
        return Verdict(
            StageStatus.MEMORY_LIMIT,
            f"memory limit of {plan.memory_mb} MB exceeded (out of memory)",
        )
    if sig == signal.SIGXFSZ:
        return Verdict(
            StageStatus.OUTPUT_LIMIT,
            f"file size limit of {plan.max_file_bytes} bytes exceeded (SIGXFSZ)",
        )
    if sig is not None:
        return Verdict(StageStatus.KILLED, f"killed by {_signal_name(sig)}")
    return Verdict(StageStatus.FINISHED, None)


def stage_cpu_ms(report: dict[str, Any], cgroup_ms: float | None) -> float | None:
    """The stage's CPU time, from the jail's cgroup, which counts every process:

    * v1: PID 1 read the counter itself just before the stage started and after its last
      process was reaped, and left out its own share (``cgroup_cpu_ms`` of the report);
    * else the host's reading around the stage (``cgroup_ms``: v2) less what PID 1 spent
      on the stage (writing the input, capturing output);
    * without cgroups, the stage process's own rusage, which misses descendants it did not
      wait for.
    """
    if report.get("cgroup_cpu_ms") is not None:
        return float(report["cgroup_cpu_ms"])
    if cgroup_ms is None:
        cpu = report.get("cpu_ms")
        return float(cpu) if cpu is not None else None
    return max(0.0, cgroup_ms - float(report.get("zygote_cpu_ms") or 0.0))


def stage_result(
    report: dict[str, Any],
    plan: StagePlan,
    *,
    oom_killed: bool,
    max_output: int,
    cgroup_cpu_ms: float | None = None,
    node_oom: bool = False,
) -> StageResult:
    cpu_ms = stage_cpu_ms(report, cgroup_cpu_ms)
    verdict = classify(report, plan, oom_killed=oom_killed, cpu_ms=cpu_ms, node_oom=node_oom)
    message = verdict.message
    stdout_truncated = bool(report.get("stdout_truncated"))
    stderr_truncated = bool(report.get("stderr_truncated"))
    if message is None and (stdout_truncated or stderr_truncated):
        message = f"output truncated to {max_output} bytes per stream"
    result = StageResult(
        status=verdict.status,
        exit_code=report.get("exit_code"),
        signal=report.get("signal"),
        stdout=str(report.get("stdout", "")),
        stderr=str(report.get("stderr", "")),
        stdout_truncated=stdout_truncated,
        stderr_truncated=stderr_truncated,
        wall_ms=float(report.get("wall_ms") or 0.0),
        cpu_ms=cpu_ms,
        wait_ms=report.get("wait_ms"),
        peak_memory_kb=report.get("maxrss_kb"),
        message=message,
    )
    return result.judge_contention() if verdict.wall_clock else result


def run_result(
    reply: dict[str, Any],
    plans: list[StagePlan],
    *,
    oom_stages: set[str],
    max_output: int,
    cgroup_cpu_ms: dict[str, float] | None = None,
    node_oom_stages: set[str] | None = None,
) -> RunResult:
    """The RunResult of one zygote reply (timings are filled in by the caller).
    ``cgroup_cpu_ms``: each stage's CPU time from the jail's cgroup, by stage name."""
    if reply.get("input_error"):
        return RunResult(
            run=StageResult(status=StageStatus.ERROR, message=str(reply["input_error"]))
        )
    reports: list[dict[str, Any]] = list(reply.get("stages", []))
    by_name = {plan.name: plan for plan in plans}
    cgroup = cgroup_cpu_ms or {}
    stages: dict[str, StageResult] = {}
    for report in reports:
        plan = by_name[report["name"]]
        stages[plan.name] = stage_result(
            report,
            plan,
            oom_killed=plan.name in oom_stages,
            max_output=max_output,
            cgroup_cpu_ms=cgroup.get(plan.name),
            node_oom=plan.name in (node_oom_stages or set()),
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
