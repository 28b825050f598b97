"""The stage's process: a spare, once it has its stage, sets itself up (session,
descriptors, rlimits) and runs the Python code or execs the toolchain."""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import resource
import signal
from typing import Any, NoReturn

from node.fncall.nsjail.zygote.common import CHILD_ENV, MAX_FD, STATUS_FD, STDIN_FILE, WORK
from node.fncall.nsjail.zygote.pythonrun import _python_main, _run_python
from node.fncall.nsjail.zygote.startup import _vm_bytes


def _child(stage: dict[str, Any], fds: tuple[int, int, int]) -> NoReturn:
    """Runs in a spare once it has its stage; never returns.

    ``fds`` are the write ends of the stdout, stderr and status pipes. A failure before
    the code runs is reported on the status pipe (``Xsetup:`` or ``Xexec:``), which the
    code itself never holds: it is close-on-exec, and closed before Python code runs.
    """
    module: Any = None
    try:
        os.setsid()
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 20) for fd in fds]
        for target, fd in enumerate(high, start=1):
            os.dup2(fd, target)
        os.set_inheritable(STATUS_FD, False)
        os.closerange(STATUS_FD + 1, MAX_FD)
        stdin = os.open(STDIN_FILE if stage.get("stdin") else "/dev/null", os.O_RDONLY)
        if stdin != 0:
            os.dup2(stdin, 0)
            os.close(stdin)
        os.chdir(WORK)
        python = stage.get("python") is not None
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        if python:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        else:
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        cpu = _cpu_rlimit(stage)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (stage["fsize"], stage["fsize"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (stage["nofile"], stage["nofile"]))
        resource.setrlimit(resource.RLIMIT_NPROC, (stage["nproc"], stage["nproc"]))
        if stage.get("as_bytes"):
            # Python code runs in this interpreter: its own mapping comes on top
            limit = stage["as_bytes"] + (_vm_bytes() if python else 0)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        if python:
            module = _python_main(stage)
    except BaseException as exc:  # report set-up failures as the stage's error
        _status(f"Xsetup:{type(exc).__name__}: {exc}")
        os._exit(126)
    if python:
        os.close(STATUS_FD)  # from here on the code runs: it must not hold the status pipe
        _run_python(stage, module)
    try:
        os.execve(stage["argv"][0], stage["argv"], CHILD_ENV)
    except OSError as exc:
        _status(f"Xexec:cannot execute {stage['argv'][0]}: {exc.strerror}")
    os._exit(127)


def _cpu_rlimit(stage: dict[str, Any]) -> int:
    """RLIMIT_CPU (soft; the hard limit is a second more): a second beyond the stage's
    time limit (its CPU-time limit when it has one, else its wall clock), so a single
    busy process always meets the clearer limit first and RLIMIT_CPU is a backstop."""
    limit_ms = stage.get("cpu_limit_ms")
    seconds = float(limit_ms) / 1000 if limit_ms is not None else float(stage["timeout"])
    return math.ceil(seconds) + 1


def _status(message: str) -> None:
    with contextlib.suppress(OSError):
        os.write(STATUS_FD, message.encode("utf-8", "replace")[:4000])
