"""An in-process fake backend for unit tests (like httpx's MockTransport).

The ``code`` of a ``fake`` execution is a JSON object that says what the "program"
does: ``{"stdout": "hi", "stderr": "", "exit": 0, "sleep": 0.5, "crash": false}``;
``"repeat": n`` prints its stdout and stderr ``n`` times, ``"files": {path: base64}`` are
the files it leaves for ``fetch_files``, ``"cpu_ms"`` (default 1) and
``"peak_memory_kb"`` what it reports having used. ``"until_file": PATH`` keeps it
running (as ``sleep`` does) until that file exists, so a test can end it when it chooses.
It needs CORRAL_DEV_MODE and is never started in production. With ``run_log`` set
(``CORRAL_FAKE='{"run_log": PATH}'``) every run appends its invocation id to that file,
so that tests can count how often an execution really ran, across processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from node.fncall import registry
from node.fncall.base import FnBackend
from wire.execution import LanguageInfo, RunResult, RunSpec, StageResult, StageStatus

if TYPE_CHECKING:
    from node.settings import NodeSettings


class FakeFnBackend(FnBackend):
    name = "fake"

    def __init__(self, *, run_log: str | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.closed = False
        self._run_log = run_log

    def languages(self) -> Sequence[LanguageInfo]:
        return [LanguageInfo(name="fake", runtime=self.name, version="1")]

    async def run(self, spec: RunSpec, *, tenant_id: str, invocation_id: str) -> RunResult:
        self.calls.append((tenant_id, invocation_id))
        if self._run_log:
            _append_line(self._run_log, invocation_id)
        try:
            program: dict[str, Any] = json.loads(spec.code or "{}")
        except json.JSONDecodeError:
            program = {"stdout": spec.code}
        started = time.perf_counter()
        if program.get("crash"):
            return RunResult(error="fake backend crashed on purpose")
        sleep = float(program.get("sleep", 0))
        limit = spec.limits.run_timeout_s
        until = program.get("until_file")
        if until is not None:
            timed_out = not await _wait_for_file(str(until), limit)
        else:
            timed_out = sleep > limit
            await asyncio.sleep(min(sleep, limit))
        if timed_out:
            stage = StageResult(status=StageStatus.TIME_LIMIT, signal=9, message="time limit")
        else:
            repeat = int(program.get("repeat", 1))
            stage = StageResult(
                status=StageStatus.FINISHED,
                exit_code=int(program.get("exit", 0)),
                stdout=str(program.get("stdout", "")) * repeat + spec.stdin,
                stderr=str(program.get("stderr", "")) * repeat,
            )
        elapsed = (time.perf_counter() - started) * 1000
        stage.wall_ms = elapsed
        stage.cpu_ms = float(program.get("cpu_ms", 1.0))
        stage.judge_contention()
        left: dict[str, str] = program.get("files", {})
        files = {path: left[path] for path in spec.fetch_files if path in left}
        peak = program.get("peak_memory_kb")
        stage.peak_memory_kb = int(peak) if peak is not None else None
        return RunResult(
            run=stage,
            files=files,
            exec_ms=elapsed,
            cpu_ms=stage.cpu_ms,
            peak_memory_kb=stage.peak_memory_kb,
        )

    async def close(self) -> None:
        self.closed = True


async def _wait_for_file(path: str, limit: float) -> bool:
    """Wait until ``path`` exists (True), at most ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while not _exists(path):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def _exists(path: str) -> bool:
    """A local stat, as ``_append_line``'s write is: the fake's runs are not I/O bound."""
    return os.path.exists(path)


def _append_line(path: str, line: str) -> None:
    """One ``write`` on an O_APPEND descriptor: lines of concurrent writers never mix."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def _factory(settings: NodeSettings) -> FnBackend:
    return FakeFnBackend(run_log=settings.fake.get("run_log"))


registry.register(FakeFnBackend.name, _factory)
