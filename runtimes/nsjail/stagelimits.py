"""Per-stage cgroup limits of one call, and which stage an OOM kill belongs to.

The host moves the jail's cgroup to each stage's limits (a compiler gets more memory and
threads than the program it builds) while the zygote waits at the stage boundary, and
reads the cgroup's OOM-kill counter there, so an OOM kill is charged to the stage in
which it happened.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtimes.nsjail.cgroups import CgroupError, JailCgroup
from runtimes.nsjail.config import MIB
from runtimes.nsjail.jail import JailError
from runtimes.nsjail.languages import StagePlan


class LimitError(JailError):
    """The jail's cgroup could not be set to a stage's limits."""


class StageLimits:
    def __init__(
        self, cgroup: JailCgroup | None, plans: Sequence[StagePlan], *, overhead_mb: int
    ) -> None:
        self._cgroup = cgroup
        self._plans = plans
        self._overhead_mb = overhead_mb
        self._oom_count: int | None = None
        self.oom_stages: set[str] = set()

    def enter(self, index: int) -> None:
        """Apply stage ``index``'s limits (charging OOM kills so far to the one before)."""
        if self._cgroup is None:
            return
        if index:
            self.settle(index - 1)
        plan = self._plans[index]
        try:
            self._cgroup.set_limits(
                memory_bytes=(plan.memory_mb + self._overhead_mb) * MIB, pids=plan.nproc
            )
        except CgroupError as exc:
            raise LimitError(f"could not apply the {plan.name} stage's limits: {exc}") from exc
        if index == 0:
            self._oom_count = self._cgroup.oom_kills()

    def settle(self, index: int) -> None:
        """Charge OOM kills since the last reading to stage ``index``."""
        if self._cgroup is None or not 0 <= index < len(self._plans):
            return
        count = self._cgroup.oom_kills()
        if count is not None and self._oom_count is not None and count > self._oom_count:
            self.oom_stages.add(self._plans[index].name)
        self._oom_count = count
