"""How many warm workers a pool keeps for one key: measured demand, clamped by settings.

Per key the pool measures two things, both as exponentially weighted averages:

* the **arrival rate** (acquires per second), a counter that decays with time constant
  ``window_s``: each acquire adds ``1 / window_s``, so a steady rate of λ reads λ, and a
  key nobody asks for fades towards zero;
* the **start time** (seconds from ``start()`` to a ready worker), per measured start.

Its target is the number of acquires expected while one worker starts, plus head-room::

    target = clamp(ceil(rate * start_time * (1 + headroom)), min, max)

A rate below ``floor_rate`` counts as none: the pool passes ``1 / idle_timeout``, because a
key asked for less than once per idle timeout would see its worker reaped between calls
anyway. Without a measured start time of its own, a key borrows the pool's (all keys).
Everything takes ``now`` from the caller's clock, so tests can drive time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: weight of the newest start-time sample
START_TIME_WEIGHT = 0.3
#: absorbs float noise before ``ceil`` (3.0000000001 must not become 4)
_EPSILON = 1e-9


@dataclass(frozen=True)
class Bounds:
    """The clamp on one key's target: at least ``min`` and at most ``max`` warm workers."""

    min: int = 0
    max: int = 4

    def __post_init__(self) -> None:
        if not 0 <= self.min <= self.max:
            raise ValueError(f"need 0 <= min <= max, got min={self.min} max={self.max}")


class ArrivalRate:
    """Arrivals per second, exponentially weighted with time constant ``window_s``."""

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self._window_s = window_s
        self._value = 0.0
        self._at: float | None = None

    def add(self, now: float, count: int = 1) -> None:
        self._value = self.value(now) + count / self._window_s
        self._at = now

    def value(self, now: float) -> float:
        if self._at is None:
            return 0.0
        return self._value * math.exp(-max(0.0, now - self._at) / self._window_s)


class StartTime:
    """Seconds a start takes, exponentially weighted over samples; None before the first."""

    def __init__(self, weight: float = START_TIME_WEIGHT) -> None:
        self._weight = weight
        self.value: float | None = None

    def add(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        if self.value is None:
            self.value = seconds
        else:
            self.value += self._weight * (seconds - self.value)


def target(
    rate: float, start_s: float | None, *, headroom: float, floor_rate: float, bounds: Bounds
) -> int:
    """``clamp(ceil(rate * start_s * (1 + headroom)), bounds)``; no demand below the floor."""
    demand = 0
    if start_s is not None and rate >= floor_rate and rate > 0:
        demand = math.ceil(rate * start_s * (1 + headroom) - _EPSILON)
    return max(bounds.min, min(bounds.max, demand))


class Sizing:
    """The demand measurements of one key."""

    def __init__(self, *, window_s: float) -> None:
        self.rate = ArrivalRate(window_s)
        self.start_time = StartTime()

    def arrived(self, now: float) -> None:
        self.rate.add(now)

    def started(self, seconds: float) -> None:
        self.start_time.add(seconds)

    def target(
        self,
        now: float,
        bounds: Bounds,
        *,
        headroom: float,
        floor_rate: float,
        fallback_start_s: float | None,
    ) -> int:
        start_s = self.start_time.value
        return target(
            self.rate.value(now),
            start_s if start_s is not None else fallback_start_s,
            headroom=headroom,
            floor_rate=floor_rate,
            bounds=bounds,
        )
