"""Running a build tool (debootstrap, skopeo, umoci, a command in a chroot).

Output is streamed line by line to a ``Progress`` and its tail kept for the error
message; a tool that is missing, fails or outlives its timeout raises
``ImageBuildError``. The tool runs in a session of its own and is killed (the whole
group) if the caller stops waiting for any reason.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from images.errors import ImageBuildError
from images.progress import Progress

log = logging.getLogger(__name__)

TAIL_LINES = 30


def require(name: str, package: str) -> str:
    """The path of program ``name``, or a clear error naming the Debian package."""
    path = shutil.which(name)
    if path is None:
        raise ImageBuildError(
            f"{name} is not installed (apt-get install {package}; scripts/setup-images.sh)"
        )
    return path


def run_tool(
    argv: Sequence[str],
    *,
    what: str,
    progress: Progress | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float | None = None,
) -> str:
    """Run ``argv`` to completion; its output (stdout and stderr merged) is returned."""
    log.debug("running %s", " ".join(argv))
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    output: list[str] = []
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as exc:
        raise ImageBuildError(f"{what}: cannot start {argv[0]}: {exc}") from exc
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        _kill_group(proc)

    timer = threading.Timer(timeout_s, expire) if timeout_s else None
    try:
        if timer is not None:
            timer.start()
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            tail.append(line.rstrip())
            if progress is not None:
                progress.tool_line(line)
        code = proc.wait()
    finally:
        if timer is not None:
            timer.cancel()
        if proc.poll() is None:
            _kill_group(proc)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    if timed_out.is_set():
        raise ImageBuildError(f"{what}: timed out after {timeout_s:.0f} s")
    if code != 0:
        last = "\n".join(tail)
        raise ImageBuildError(f"{what} failed (exit {code}):\n{last}")
    return "".join(output)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
