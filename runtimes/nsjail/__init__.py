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
* ``workers``   jails as workers of the shared pool (``runtimes.pools``): keys, binding
* ``languages`` toolchains and the per-call stage plan
* ``request``   checking a RunSpec and building the zygote request
* ``stagelimits`` per-stage cgroup limits; OOM kills and CPU time charged to a stage
* ``results``   mapping stage reports to StageResult statuses
* ``runtime``   ``NsjailRuntime``, the ``Runtime`` implementation
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtimes import registry
from runtimes.base import Runtime
from runtimes.nsjail.config import NsjailConfig
from runtimes.nsjail.runtime import NsjailRuntime

if TYPE_CHECKING:
    from runtimes.node.settings import NodeSettings

__all__ = ["NsjailConfig", "NsjailRuntime"]


def _factory(settings: NodeSettings) -> Runtime:
    return NsjailRuntime(NsjailConfig.from_settings(settings))


registry.register(NsjailRuntime.name, _factory)
