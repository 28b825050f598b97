"""Running one stage: hand it to a spare, capture its output, enforce its wall-clock
and CPU-time limits, kill and reap what it left, and report it."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from typing import Any

from node.fncall.nsjail.zygote.accounting import (
    _cgroup_cpu_ns,
    _jail_cpu_ms,
    _jail_wait_ms,
    _other_processes,
    _reaped_cpu_ms,
    _self_cpu_ms,
)
from node.fncall.nsjail.zygote.capture import Capture
from node.fncall.nsjail.zygote.child import _cpu_rlimit
from node.fncall.nsjail.zygote.cleanup import _kill_all
from node.fncall.nsjail.zygote.handles import Spare, Template, TemplateGone

DRAIN_AFTER_EXIT_S = 2.0
#: how often a stage's CPU time is checked against a CPU-time limit
CPU_TICK_S = 0.05


def _launch(
    stage: dict[str, Any], spare: Spare | None, template: Template, cpu_fd: int | None
) -> tuple[Spare, int | None, float]:
    """A process running ``stage`` (the given spare, or a fresh one if it is unusable),
    and the jail's CPU counter and PID 1's own CPU time read just before it started."""
    for candidate in (spare, None):
        child = candidate if candidate is not None else Spare(template)
        cpu_mark, self_mark = _cgroup_cpu_ns(cpu_fd), _self_cpu_ms()
        if child.start(stage):
            return child, cpu_mark, self_mark
        child.discard()
    raise RuntimeError("cannot start a child")


def run_stage(
    stage: dict[str, Any],
    index: int,
    max_output: int,
    template: Template,
    spare: Spare | None = None,
    cpu_since: float | None = None,
    cpu_fd: int | None = None,
) -> dict[str, Any]:
    """Run one stage to its end and report it. ``stage["timeout"]`` is its wall-clock
    limit; ``stage["cpu_limit_ms"]``, when set, a limit on the CPU time of all of its
    processes, checked every ``CPU_TICK_S``. ``cpu_since``: PID 1's own CPU time when its
    work for this stage began (``zygote_cpu_ms`` is what it spent since). ``cpu_fd``: the
    jail's cgroup CPU counter; with it the report's ``cgroup_cpu_ms`` is the CPU time of
    the stage's processes, from just before the stage started to after the last of them
    was reaped, PID 1's own share left out."""
    self_before = _self_cpu_ms() if cpu_since is None else cpu_since
    keep = template.keep()
    reaped_before = _reaped_cpu_ms()
    try:
        child, cgroup_before, self_mark = _launch(stage, spare, template, cpu_fd)
    except (TemplateGone, OSError) as exc:
        return _unstarted(stage, index, f"cannot fork its process: {exc}")
    started = time.monotonic()
    pid, pidfd = child.pid, child.pidfd
    out_r, err_r, st_r = child.fds
    captures = [Capture(out_r, max_output), Capture(err_r, max_output), Capture(st_r, 4096)]
    by_fd = {c.fd: c for c in captures}
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    for capture in captures:
        poller.register(capture.fd, select.POLLIN)
    deadline = started + float(stage["timeout"])
    cpu_limit = stage.get("cpu_limit_ms")
    next_cpu_check = started + CPU_TICK_S
    timed_out = cpu_exceeded = exited = False
    wait_ms: float | None = None
    try:
        while not exited:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if cpu_limit is not None and now >= next_cpu_check:
                next_cpu_check = now + CPU_TICK_S
                if _jail_cpu_ms(keep, reaped_before) >= float(cpu_limit):
                    cpu_exceeded = True
                    break
            wait = deadline - now if cpu_limit is None else min(deadline, next_cpu_check) - now
            for fd, _ in poller.poll(max(1, int(wait * 1000 + 1))):
                if fd == pidfd:
                    exited = True
                    continue
                capture = by_fd[fd]
                capture.read()
                if not capture.open:
                    poller.unregister(fd)
        if timed_out:  # was it waiting for a CPU, or sleeping? (before the kill)
            wait_ms = _jail_wait_ms(keep)
        if timed_out or cpu_exceeded:
            for target in (-pid, pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(target, signal.SIGKILL)
        _, status, usage = os.wait4(pid, 0)
        wall_ms = (time.monotonic() - started) * 1000
        leftover = _other_processes(keep)
        _kill_all(keep)
        # every writer is dead now: whatever is in the pipes ends with EOF
        drain_deadline = time.monotonic() + DRAIN_AFTER_EXIT_S
        while any(c.open for c in captures) and time.monotonic() < drain_deadline:
            for fd, _ in poller.poll(100):
                if fd in by_fd:
                    by_fd[fd].read()
                    if not by_fd[fd].open:
                        poller.unregister(fd)
    finally:
        os.close(pidfd)
        for capture in captures:
            os.close(capture.fd)
    report: dict[str, Any] = {
        "name": stage["name"],
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "stdout": captures[0].text(),
        "stderr": captures[1].text(),
        "stdout_truncated": captures[0].truncated,
        "stderr_truncated": captures[1].truncated,
        "wall_ms": wall_ms,
        # the stage's process and the descendants it waited for; the host charges the
        # jail's cgroup instead, which counts every process
        "cpu_ms": (usage.ru_utime + usage.ru_stime) * 1000,
        "zygote_cpu_ms": _self_cpu_ms() - self_before,
        "cgroup_cpu_ms": None,
        "maxrss_kb": usage.ru_maxrss,
        "timed_out": timed_out,
        "wait_ms": wait_ms,
        "cpu_exceeded": cpu_exceeded,
        "cpu_limit_s": _cpu_rlimit(stage),
        "error": None,
        "start_failure": None,
        "leftover": leftover,
    }
    cgroup_after = _cgroup_cpu_ns(cpu_fd)
    if cgroup_before is not None and cgroup_after is not None:
        own_ms = _self_cpu_ms() - self_mark
        report["cgroup_cpu_ms"] = max(0.0, (cgroup_after - cgroup_before) / 1e6 - own_ms)
    note = bytes(captures[2].data).decode("utf-8", "replace")
    if note.startswith("X"):
        kind, _, message = note[1:].partition(":")
        # the first stage starts before any of the call's code has run; a later one may
        # fail to start because of what an earlier stage's code did (removed the work
        # dir, built a ./main that cannot be executed): that is the code's failure, unless
        # a toolchain (an absolute path) could not be executed
        toolchain = kind == "exec" and str(stage["argv"][0]).startswith("/")
        report["error" if index == 0 or toolchain else "start_failure"] = message
    return report


def _unstarted(stage: dict[str, Any], index: int, failure: str) -> dict[str, Any]:
    """The report of a stage whose process could not be forked: the platform's failure
    in the first stage (nothing of the call has run yet), the code's in a later one (an
    earlier stage's code may have killed the template)."""
    return {
        "name": stage["name"],
        "exit_code": None if index == 0 else 126,
        "signal": None,
        "stdout": "",
        "stderr": "",
        "wall_ms": 0.0,
        "cpu_ms": 0.0,
        "zygote_cpu_ms": 0.0,
        "cgroup_cpu_ms": None,
        "maxrss_kb": 0,
        "timed_out": False,
        "cpu_exceeded": False,
        "cpu_limit_s": _cpu_rlimit(stage),
        "error": failure if index == 0 else None,
        "start_failure": failure if index else None,
        "leftover": 0,
    }
