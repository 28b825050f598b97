"""Summaries shared by the benchmarks: one definition of p50/p90/p99, and of comparing
trees by alternating runs and their medians."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
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


def alternate[T](
    trees: dict[str, T], rounds: int, run: Callable[[T], dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """``run`` each tree ``rounds`` times, the order reversed every other round (after,
    before, before, after, ...), so a drift of the machine falls on every tree alike."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for round_ in range(rounds):
        order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
        for name in order:
            runs[name].append(run(trees[name]))
    return runs


def medians(runs: list[dict[str, Any]], keys: Iterable[str] | None = None) -> dict[str, float]:
    """The median over ``runs`` of each of ``keys`` (default: all of the first run's)."""
    chosen = list(keys) if keys is not None else list(runs[0])
    return {key: round(statistics.median(run[key] for run in runs), 3) for key in chosen}
