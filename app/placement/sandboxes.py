"""Where a new sandbox goes: a node that offers its backend and has room for its size.

A node reports what it gives sandboxes (``NodeReport.sandbox_memory_mb``,
``sandbox_cpu``: the sums of their limits it accepts) and what is still free of it.
A sandbox goes only where its memory and CPU fit what is free now, on the better of two
such nodes (fewer live sandboxes, then more memory free). When no node offering the
backend could ever hold it (it asks more than any node gives all its sandboxes), the
create is refused for good: 422 ``sandbox_too_large``; when some could but none has
room now, 503 ``no_capacity`` with Retry-After. A backend no node offers while others
are offered (``"microvm"`` on a fleet of container nodes) is refused at once: 422
``backend_not_offered``, naming the backends on offer; with no node up at all it is 503
``no_capacity`` (a node may be starting). A report that says nothing of sandbox
capacity (a node older than these fields) is taken as able to hold anything.

The reports are the catalogue's copy, up to ``catalogue_seconds`` old: two creates may
pick the same room at once. The node's own check (``SandboxManager.create``) refuses the
one that does not fit, race-free, with 503 ``no_capacity``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from app.errors import BackendNotOffered, NoCapacity, SandboxTooLarge
from wire.messages import NodeReport


def could_hold(report: NodeReport, *, memory_mb: int, cpu: float) -> bool:
    """The node could hold the sandbox if it held nothing else."""
    memory_ok = report.sandbox_memory_mb is None or memory_mb <= report.sandbox_memory_mb
    cpu_ok = report.sandbox_cpu is None or cpu <= report.sandbox_cpu
    return memory_ok and cpu_ok


def has_room(report: NodeReport, *, memory_mb: int, cpu: float) -> bool:
    """The node has room for the sandbox now (a place, its memory and CPU)."""
    if report.sandbox_room <= 0:
        return False
    memory_ok = report.sandbox_memory_mb is None or memory_mb <= report.sandbox_memory_free_mb
    cpu_ok = report.sandbox_cpu is None or cpu <= report.sandbox_cpu_free + 1e-9
    return memory_ok and cpu_ok


def check(report: NodeReport, *, memory_mb: int, cpu: float) -> None:
    """Refuse a sandbox that this one node (a snapshot's) cannot take."""
    if not could_hold(report, memory_mb=memory_mb, cpu=cpu):
        raise _too_large([report], memory_mb=memory_mb, cpu=cpu)
    if not has_room(report, memory_mb=memory_mb, cpu=cpu):
        raise NoCapacity(
            f"node {report.node_id} (which holds the snapshot) has no room for "
            f"{memory_mb} MiB and {cpu:g} CPU now"
        )


def refuse_too_large(
    reports: Sequence[NodeReport], backend: str, *, memory_mb: int, cpu: float
) -> None:
    """Refuse for good (422) a sandbox no node offering ``backend`` could ever hold (with
    none offering it, nothing is said: that may change in a moment)."""
    nodes = _offering(reports, backend)
    if nodes and not any(could_hold(n, memory_mb=memory_mb, cpu=cpu) for n in nodes):
        raise _too_large(nodes, memory_mb=memory_mb, cpu=cpu)


def _offering(reports: Sequence[NodeReport], backend: str) -> list[NodeReport]:
    return [n for n in reports if backend in n.sandbox_backends and n.address is not None]


def choose(
    reports: Sequence[NodeReport],
    backend: str,
    *,
    memory_mb: int,
    cpu: float,
    rng: random.Random | None = None,
) -> NodeReport:
    """The node a new sandbox of ``backend`` and this size goes to."""
    nodes = _offering(reports, backend)
    if not nodes:
        offered = sorted({b for n in reports if n.address is not None for b in n.sandbox_backends})
        if offered:
            raise BackendNotOffered(
                f"no node offers {backend} sandboxes (on offer: {', '.join(offered)})",
                details={"backend": backend, "offered": offered},
            )
        raise NoCapacity(f"no node offers {backend} sandboxes now")
    refuse_too_large(nodes, backend, memory_mb=memory_mb, cpu=cpu)
    able = [n for n in nodes if could_hold(n, memory_mb=memory_mb, cpu=cpu)]
    with_room = [n for n in able if has_room(n, memory_mb=memory_mb, cpu=cpu)]
    if not with_room:
        raise NoCapacity(
            f"every node offering {backend} sandboxes is full (none has {memory_mb} MiB and "
            f"{cpu:g} CPU free for sandboxes now)"
        )
    choices = (rng or random).sample(with_room, min(2, len(with_room)))
    return min(choices, key=lambda n: (n.sandboxes, -_free_mb(n)))


def _free_mb(report: NodeReport) -> int:
    if report.sandbox_memory_mb is None:
        return report.memory_free_mb
    return report.sandbox_memory_free_mb


def _too_large(nodes: Sequence[NodeReport], *, memory_mb: int, cpu: float) -> SandboxTooLarge:
    memory = max((n.sandbox_memory_mb or 0) for n in nodes)
    cores = max((n.sandbox_cpu or 0.0) for n in nodes)
    return SandboxTooLarge(
        f"the sandbox asks {memory_mb} MiB and {cpu:g} CPU; no node gives its sandboxes "
        f"that much (the largest: {memory} MiB, {cores:g} CPU)",
        details={"quota": None, "largest": {"memory_mb": memory, "cpu": cores}},
    )
