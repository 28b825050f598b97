"""From what a request asks for to the limits an execution runs under, checked against
the tenant's quota. The one place that does it, for every entry point.

``/v1/run`` and tool functions refuse a limit over the quota (422 ``limit_too_high``);
SandboxFusion's ``/run_code`` caps it instead, because its clients score any non-200 as
a failed reward.
"""

from __future__ import annotations

from typing import Literal

from app.errors import LimitTooHigh
from app.quotas.spec import QuotaLimits
from wire.execution import RunLimits

#: Memory given to an execution that names none, unless the tenant's maximum is lower.
DEFAULT_MEMORY_MB = 512
#: Time given to a stage that names none, unless the tenant's maximum is lower.
DEFAULT_TIMEOUT_S = 10.0

OnExcess = Literal["refuse", "cap"]


def limits_for(
    quota: QuotaLimits,
    *,
    memory_mb: int | None = None,
    run_timeout_s: float | None = None,
    compile_timeout_s: float | None = None,
    on_excess: OnExcess = "refuse",
) -> RunLimits:
    """The limits of one execution: defaults filled in, every one checked against ``quota``."""
    memory = memory_mb if memory_mb is not None else min(DEFAULT_MEMORY_MB, quota.max_memory_mb)
    run = (
        run_timeout_s
        if run_timeout_s is not None
        else min(DEFAULT_TIMEOUT_S, quota.max_wall_seconds)
    )
    compile_ = (
        compile_timeout_s
        if compile_timeout_s is not None
        else min(DEFAULT_TIMEOUT_S, quota.max_wall_seconds)
    )
    if on_excess == "cap":
        return RunLimits(
            memory_mb=max(16, min(memory, quota.max_memory_mb)),
            run_timeout_s=min(run, quota.max_wall_seconds),
            compile_timeout_s=min(compile_, quota.max_wall_seconds),
        )
    if memory > quota.max_memory_mb:
        raise LimitTooHigh(
            f"memory limit {memory} MB is over the tenant's max_memory_mb {quota.max_memory_mb}"
        )
    for name, seconds in (("run_timeout", run), ("compile_timeout", compile_)):
        if seconds > quota.max_wall_seconds:
            raise LimitTooHigh(
                f"{name} {seconds:g}s is over the tenant's max_wall_seconds "
                f"{quota.max_wall_seconds:g}s"
            )
    return RunLimits(memory_mb=memory, run_timeout_s=run, compile_timeout_s=compile_)
