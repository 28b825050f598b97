"""Per-stage cgroup limits of one call, and what each stage used of the jail's cgroup.

The host moves the jail's cgroup to each stage's limits (a compiler gets more memory and
threads than the program it builds) while the zygote waits at the stage boundary, and
reads the cgroup's OOM-kill counter and CPU usage there: an OOM kill is charged to the
stage in which it happened (to the node, ``node_oom_stages``, when the jail's peak
never reached its own limit: the jails together reached their parent's), and each stage
gets the CPU time every process of the jail
used meanwhile (``cpu_ns``), descendants it never waited for included. That CPU reading
is what a v2 jail is charged; on v1 the zygote reads the same counter itself, closer to
the stage (``results.stage_cpu_ms`` says which wins).
"""

from __future__ import annotations

from collections.abc import Sequence

from node.fncall.nsjail.cgroups import CgroupError, JailCgroup
from node.fncall.nsjail.config import MIB
from node.fncall.nsjail.jail import JailError
from node.fncall.nsjail.jailcgroup import OUTSIDE_NPROC
from node.fncall.nsjail.languages import StagePlan


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
        self._cpu_mark: int | None = None
        self.oom_stages: set[str] = set()
        #: stages whose OOM kill came from the node's jails together, not their own limit
        self.node_oom_stages: set[str] = set()
        #: CPU time (ns) the jail's cgroup counted during each settled stage, by name
        self.cpu_ns: dict[str, int] = {}

    def enter(self, index: int) -> None:
        """Apply stage ``index``'s limits (settling the one before: OOM kills, CPU)."""
        if self._cgroup is None:
            return
        if index:
            self.settle(index - 1)
        plan = self._plans[index]
        try:
            self._cgroup.set_limits(
                memory_bytes=(plan.memory_mb + self._overhead_mb) * MIB,
                pids=plan.nproc + OUTSIDE_NPROC,
            )
        except CgroupError as exc:
            raise LimitError(f"could not apply the {plan.name} stage's limits: {exc}") from exc
        self._cgroup.mark_peak()
        if index == 0:
            self._oom_count = self._cgroup.oom_kills()
            self._cpu_mark = self._cgroup.cpu_usage_ns()

    def settle(self, index: int) -> None:
        """Charge OOM kills and CPU time since the last reading to stage ``index``."""
        if self._cgroup is None or not 0 <= index < len(self._plans):
            return
        name = self._plans[index].name
        count = self._cgroup.oom_kills()
        if count is not None and self._oom_count is not None and count > self._oom_count:
            own = self._cgroup.reached_limit() is not False
            (self.oom_stages if own else self.node_oom_stages).add(name)
        self._oom_count = count
        usage = self._cgroup.cpu_usage_ns()
        if usage is not None and self._cpu_mark is not None:
            self.cpu_ns[name] = usage - self._cpu_mark
        self._cpu_mark = usage

    def cpu_ms(self) -> dict[str, float]:
        return {name: ns / 1e6 for name, ns in self.cpu_ns.items()}
