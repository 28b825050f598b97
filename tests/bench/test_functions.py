"""``bench/functions.py`` reports where a call's latency went from the platform's record."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from functions import phases_p50  # noqa: E402


def test_each_phase_is_the_median_of_the_answers_that_have_it() -> None:
    timings = [
        {"queue_ms": 1.0, "setup_ms": 5.0, "exec_ms": 0.5, "total_ms": 7.0},
        {"queue_ms": 3.0, "setup_ms": 1.0, "exec_ms": None, "total_ms": 4.0},
        {"queue_ms": 2.0, "setup_ms": 2.0, "exec_ms": 1.5, "total_ms": 5.0},
    ]
    assert phases_p50(timings) == {
        "queue_ms": 2.0,
        "setup_ms": 2.0,
        "exec_ms": 1.0,
        "total_ms": 5.0,
    }
    assert phases_p50([]) == {}
