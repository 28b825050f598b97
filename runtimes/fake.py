"""An in-process fake backend for unit tests (like httpx's MockTransport).

The ``code`` of a ``fake`` execution is a JSON object that says what the "program"
does: ``{"stdout": "hi", "stderr": "", "exit": 0, "sleep": 0.5, "crash": false}``.
It needs CORRAL_DEV_MODE and is never started in production.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from runtimes import registry
from runtimes.base import Runtime
from runtimes.models import LanguageInfo, RunResult, RunSpec, StageResult, StageStatus

if TYPE_CHECKING:
    from app.settings import Settings


class FakeRuntime(Runtime):
    name = "fake"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.closed = False

    def languages(self) -> Sequence[LanguageInfo]:
        return [LanguageInfo(name="fake", runtime=self.name, version="1")]

    async def run(self, spec: RunSpec, *, tenant_id: str, invocation_id: str) -> RunResult:
        self.calls.append((tenant_id, invocation_id))
        try:
            program: dict[str, Any] = json.loads(spec.code or "{}")
        except json.JSONDecodeError:
            program = {"stdout": spec.code}
        started = time.perf_counter()
        if program.get("crash"):
            return RunResult(error="fake backend crashed on purpose")
        sleep = float(program.get("sleep", 0))
        limit = spec.limits.run_timeout_s
        if sleep > limit:
            await asyncio.sleep(limit)
            stage = StageResult(status=StageStatus.TIME_LIMIT, signal=9, message="time limit")
        else:
            await asyncio.sleep(sleep)
            stage = StageResult(
                status=StageStatus.FINISHED,
                exit_code=int(program.get("exit", 0)),
                stdout=str(program.get("stdout", "")) + spec.stdin,
                stderr=str(program.get("stderr", "")),
            )
        elapsed = (time.perf_counter() - started) * 1000
        stage.wall_ms = elapsed
        stage.cpu_ms = float(program.get("cpu_ms", 1.0))
        return RunResult(run=stage, exec_ms=elapsed, cpu_ms=stage.cpu_ms)

    async def close(self) -> None:
        self.closed = True


def _factory(settings: Settings) -> Runtime:
    return FakeRuntime()


registry.register(FakeRuntime.name, _factory)
