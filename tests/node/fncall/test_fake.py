"""The fake backend's ``until_file``: it runs until the file exists, or its time limit."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from node.fncall.fake import FakeFnBackend
from wire.execution import RunLimits, RunSpec, StageStatus


def _spec(path: Path, timeout_s: float) -> RunSpec:
    return RunSpec(
        language="fake",
        code=json.dumps({"until_file": str(path), "stdout": "done"}),
        limits=RunLimits(run_timeout_s=timeout_s),
    )


async def test_a_run_ends_once_its_file_appears(tmp_path: Path) -> None:
    release = tmp_path / "release"
    running = asyncio.create_task(
        FakeFnBackend().run(_spec(release, 30.0), tenant_id="t", invocation_id="i")
    )
    await asyncio.sleep(0.1)
    assert not running.done()
    release.touch()
    result = await asyncio.wait_for(running, 5)
    assert result.run is not None and result.run.status is StageStatus.FINISHED
    assert result.run.stdout == "done"


async def test_a_file_that_never_appears_is_a_time_limit(tmp_path: Path) -> None:
    result = await FakeFnBackend().run(
        _spec(tmp_path / "never", 0.2), tenant_id="t", invocation_id="i"
    )
    assert result.run is not None and result.run.status is StageStatus.TIME_LIMIT
