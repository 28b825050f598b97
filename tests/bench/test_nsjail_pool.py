"""``bench/nsjail_pool.py --concurrency``: the warm pool alone, several calls at a time, and
what its calls cost the machine and the host process."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from node.fncall.nsjail import NsjailBackend, NsjailConfig
from tests.requirements import require_nsjail

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from nsjail_pool import bench_concurrent  # noqa: E402

pytestmark = [pytest.mark.nsjail]


def test_every_call_is_counted_and_the_jails_cost_the_machine_more_than_the_host() -> None:
    require_nsjail()

    async def measure() -> dict[str, Any]:
        runtime = NsjailBackend(NsjailConfig(languages=["python"], warm_per_language=1))
        await runtime.start()
        try:
            return await bench_concurrent(runtime, 203, 4)  # each call's output is checked
        finally:
            await runtime.close()

    report = asyncio.run(measure())
    assert (report["calls"], report["concurrency"]) == (200, 4)  # 50 per worker
    assert report["calls_per_s"] > 0
    # the machine's figure holds this process's and the jails' (each forks a process per
    # call): it is the larger
    assert report["machine_ms_per_call"] > report["this_process_ms_per_call"] > 0
