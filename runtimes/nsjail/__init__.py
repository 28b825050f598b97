"""The nsjail FnCall backend: warm per-tenant jails with a forking zygote inside.

Importing this package registers the backend as ``"nsjail"``. Modules, one concept each:

* ``config``    tunables (``NsjailConfig``) and their derivation from ``NodeSettings``
* ``seccomp``   the Kafel seccomp policy
* ``cgroups``   cgroup v1/v2 detection, nsjail flags, per-jail limits and OOM counter
* ``command``   the nsjail command line: namespaces, mounts, rlimits
* ``zygote``    the script that runs as PID 1 in every jail (stdlib-only, Python 3.11)
* ``jail``      one jail process and the framed JSON channel to its zygote
* ``workers``   jails as workers of the shared pool (``runtimes.pools``): keys, binding
* ``languages`` toolchains and the per-call stage plan
* ``request``   checking a RunSpec and building the zygote request
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
