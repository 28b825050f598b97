"""What a backend tells its pool: bounds, timeouts, recycling and sizing knobs.

Each backend builds one ``PoolConfig`` from its own settings (``NsjailConfig``,
``WasmConfig``) when it starts; the pool reads nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from node.pools.sizing import Bounds


@dataclass(frozen=True)
class PoolConfig:
    #: live plus starting workers over all keys; when full, an acquire that must start a
    #: worker evicts the least recently used idle worker of another key. None: no bound.
    max_workers: int | None = None
    #: time ``WorkerFactory.start`` has to return a ready worker
    start_timeout_s: float = 15.0
    #: background starts (refill, initial warm-up) in flight at once, over all keys;
    #: starts a caller waits for are not counted
    start_concurrency: int = 2
    #: starts in flight at once over all keys, for callers and in the background alike
    #: (None: no bound but ``max_workers``); keys waiting for one take turns
    max_starting: int | None = None
    #: starts in flight at once for one key (one tenant's workers): a key's burst grows
    #: its own pool this many workers at a time and waits for them, never taking every
    #: start the node can make (None: no bound)
    max_starting_per_key: int | None = None
    #: how long an acquire waits for a worker before ``PoolExhausted``
    acquire_timeout_s: float = 30.0
    #: idle workers above their key's target are stopped after this long idle; a key
    #: asked for less than once per idle timeout has no demand (``sizing``)
    idle_timeout_s: float = 60.0
    #: how often the reaper runs
    reap_interval_s: float = 2.0
    #: reusable workers are recycled at this age / after this many calls (None: never)
    max_age_s: float | None = None
    max_uses: int | None = None
    #: target = ceil(rate * start time * (1 + headroom)), clamped by the key's bounds
    headroom: float = 0.5
    #: time constant of the arrival-rate average
    demand_window_s: float = 30.0
    #: bounds of keys that were not declared (``Pool.declare``)
    default_bounds: Bounds = field(default_factory=Bounds)
    #: one-shot workers only: how long a handed-out worker keeps counting as supply, so
    #: that its replacement does not warm up while its (short) call still runs
    refill_delay_s: float = 0.0
    #: refill back-off after failed starts of a key: first delay, doubling up to the max
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_workers is not None and self.max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        if self.start_concurrency < 1:
            raise ValueError("start_concurrency must be at least 1")
        for bound in ("max_starting", "max_starting_per_key"):
            value = getattr(self, bound)
            if value is not None and value < 1:
                raise ValueError(f"{bound} must be at least 1")
        positive = ("start_timeout_s", "acquire_timeout_s", "idle_timeout_s", "reap_interval_s")
        for name in (*positive, "demand_window_s", "backoff_s", "max_backoff_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.headroom < 0 or self.refill_delay_s < 0:
            raise ValueError("headroom and refill_delay_s must not be negative")

    @property
    def floor_rate(self) -> float:
        """Arrival rate below which a key has no demand of its own."""
        return 1.0 / self.idle_timeout_s

    def backoff(self, failures: int) -> float:
        """Refill delay after ``failures`` failed starts in a row (0 after none)."""
        if failures <= 0:
            return 0.0
        return float(min(self.max_backoff_s, self.backoff_s * 2 ** (failures - 1)))
