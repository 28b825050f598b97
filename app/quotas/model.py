"""A tenant's quota, as a plain immutable value the admission path can cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.db.models import Quota
    from app.settings import QuotaDefaults


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    max_concurrent_executions: int
    max_concurrent_sandboxes: int
    executions_per_second: float
    burst: int
    cpu_seconds_per_day: float
    max_memory_mb: int
    max_wall_seconds: float
    max_sandbox_lifetime_seconds: int

    @classmethod
    def from_row(cls, row: Quota) -> QuotaLimits:
        return cls(**{name: getattr(row, name) for name in cls.__slots__})

    @classmethod
    def from_defaults(cls, defaults: QuotaDefaults) -> QuotaLimits:
        return cls(**{name: getattr(defaults, name) for name in cls.__slots__})
