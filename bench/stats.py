"""Latency summaries shared by the benchmarks: one definition of p50/p90/p99."""

from __future__ import annotations

import statistics
from typing import Any


def percentile(ordered: list[float], q: float) -> float:
    """The ``q``-th percentile of already sorted samples (nearest rank)."""
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def latency_summary(
    samples_ms: list[float], *, wall_s: float | None = None, errors: int | None = None
) -> dict[str, Any]:
    """n, p50/p90/p99, mean and max in ms; calls per second and errors when given."""
    ordered = sorted(samples_ms)
    out: dict[str, Any] = {"n": len(ordered)}
    if ordered:
        out |= {
            "p50_ms": round(percentile(ordered, 50), 3),
            "p90_ms": round(percentile(ordered, 90), 3),
            "p99_ms": round(percentile(ordered, 99), 3),
            "mean_ms": round(statistics.fmean(ordered), 3),
            "max_ms": round(ordered[-1], 3),
        }
    if errors is not None:
        out["errors"] = errors
    if wall_s:
        out["throughput_per_s"] = round(len(ordered) / wall_s, 1)
    return out
