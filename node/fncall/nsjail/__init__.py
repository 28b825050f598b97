"""The nsjail FnCall backend: warm per-tenant jails with a zygote and a pristine template
inside.

Importing this package registers the backend as ``"nsjail"``. Modules, one concept each:

* ``config``    tunables (``NsjailConfig``) and their derivation from ``NodeSettings``
* ``seccomp``   the Kafel seccomp policy (an allow-list)
* ``cgroups``   cgroup v1/v2 detection; how a jail gets its groups
* ``jailcgroup`` the host's handle on one jail's groups: limits, OOM counter, CPU usage
* ``sharedfs``  the private tmpfs of generated /etc files and masks every jail binds
* ``command``   the nsjail command line: namespaces, mounts, masks, rlimits
* ``zygote``    PID 1 of every jail, its template and the stages' processes (stdlib-only,
  Python 3.11): a package of modules joined into the one script a jail runs
* ``jail``      one jail process and the framed JSON channel to its zygote
* ``workers``   jails as workers of the shared pool (``node.pools``): keys, binding
* ``languages`` toolchains and the per-call stage plan
* ``request``   checking a RunSpec and building the zygote request
* ``stagelimits`` per-stage cgroup limits; OOM kills and CPU time charged to a stage
* ``results``   mapping stage reports to StageResult statuses
* ``backend``   ``NsjailBackend``, the ``FnBackend`` implementation
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from node.fncall import registry
from node.fncall.base import FnBackend
from node.fncall.nsjail.backend import NsjailBackend
from node.fncall.nsjail.config import NsjailConfig

if TYPE_CHECKING:
    from node.settings import NodeSettings

__all__ = ["NsjailBackend", "NsjailConfig"]


def _factory(settings: NodeSettings) -> FnBackend:
    return NsjailBackend(NsjailConfig.from_settings(settings))


registry.register(NsjailBackend.name, _factory)
