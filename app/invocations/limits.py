"""From what a request asks for to the limits an execution runs under, checked against
the tenant's quota. The one place that does it, for every entry point.

``/v1/run`` and tool functions refuse a limit over the quota (422 ``limit_too_high``);
SandboxFusion's ``/run_code`` caps it instead, because its clients score any non-200 as
a failed reward, and says so in its answer. A compile stage gets at most the tenant's
memory maximum; time is judged on the tenant's ``time_limit_basis``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from app.errors import LimitTooHigh
from app.quotas.spec import QuotaLimits
from wire.execution import RunLimits

#: Memory given to an execution that names none, unless the tenant's maximum is lower.
DEFAULT_MEMORY_MB = 512
#: Time given to a stage that names none, unless the tenant's maximum is lower.
DEFAULT_TIMEOUT_S = 10.0

#: Memory of a compile stage, unless the tenant's maximum is lower.
DEFAULT_COMPILE_MEMORY_MB = 1024

OnExcess = Literal["refuse", "cap"]


@dataclass(frozen=True, slots=True)
class Granted:
    """The limits an execution runs under, and what was lowered to fit the quota."""

    limits: RunLimits
    capped: dict[str, dict[str, float]] = field(default_factory=dict)


def limits_for(
    quota: QuotaLimits,
    *,
    memory_mb: int | None = None,
    run_timeout_s: float | None = None,
    compile_timeout_s: float | None = None,
    on_excess: OnExcess = "refuse",
) -> RunLimits:
    """The limits of one execution: defaults filled in, every one checked against ``quota``
    (``refuse``: 422 ``limit_too_high``; ``cap``: lowered to the quota)."""
    return grant(
        quota,
        memory_mb=memory_mb,
        run_timeout_s=run_timeout_s,
        compile_timeout_s=compile_timeout_s,
        on_excess=on_excess,
    ).limits


def grant(
    quota: QuotaLimits,
    *,
    memory_mb: int | None = None,
    run_timeout_s: float | None = None,
    compile_timeout_s: float | None = None,
    on_excess: OnExcess = "refuse",
) -> Granted:
    """``limits_for``, also saying which requested limits were lowered (``cap``)."""
    wall = quota.max_wall_seconds
    asked = {
        "memory_mb": float(memory_mb)
        if memory_mb is not None
        else float(min(DEFAULT_MEMORY_MB, quota.max_memory_mb)),
        "run_timeout_s": run_timeout_s
        if run_timeout_s is not None
        else min(DEFAULT_TIMEOUT_S, wall),
        "compile_timeout_s": compile_timeout_s
        if compile_timeout_s is not None
        else min(DEFAULT_TIMEOUT_S, wall),
    }
    ceiling = {
        "memory_mb": float(quota.max_memory_mb),
        "run_timeout_s": wall,
        "compile_timeout_s": wall,
    }
    over = {name: value for name, value in asked.items() if value > ceiling[name]}
    if over and on_excess == "refuse":
        name, value = next(iter(over.items()))
        quota_name = "max_memory_mb" if name == "memory_mb" else "max_wall_seconds"
        raise LimitTooHigh(f"{name} {value:g} is over the tenant's {quota_name} {ceiling[name]:g}")
    granted = {name: min(value, ceiling[name]) for name, value in asked.items()}
    limits = RunLimits(
        memory_mb=max(16, int(granted["memory_mb"])),
        run_timeout_s=granted["run_timeout_s"],
        compile_timeout_s=granted["compile_timeout_s"],
        compile_memory_mb=max(16, min(DEFAULT_COMPILE_MEMORY_MB, quota.max_memory_mb)),
        time_basis=quota.time_limit_basis,
    )
    capped = {name: {"requested": value, "granted": granted[name]} for name, value in over.items()}
    return Granted(limits, capped)
