"""The protocol every execution backend implements.

A backend is to Corral what a transport is to httpx: one small abstract class, many
implementations registered by name (``node.fncall.registry``), and an in-process fake
(``node.fncall.fake``) for unit tests.

Lifecycle: the node agent constructs a backend from its settings, ``await start()``
warms its pools before any request arrives, ``await run(...)`` executes one stateless
call, and ``await close()`` releases every process, mount and cgroup it holds. ``close``
must be safe to call after a failed ``start``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from node.artifacts import Artifacts
from node.pools.accounting import IdleCapacity
from wire.execution import LanguageInfo, RunResult, RunSpec


class FnBackend(ABC):
    """A stateless execution backend (the FnCall tier)."""

    #: Registry name, e.g. ``"nsjail"``.
    name: ClassVar[str]
    #: Where a backend gets the artifact a ``RunSpec.artifact`` names (set by the node
    #: agent; None: such specs cannot run here).
    artifacts: Artifacts | None = None

    async def start(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Prepare warm workers. Called once before the first ``run``."""

    @abstractmethod
    def languages(self) -> Sequence[LanguageInfo]:
        """Languages this backend can run on this node."""

    @abstractmethod
    async def run(self, spec: RunSpec, *, tenant_id: str, invocation_id: str) -> RunResult:
        """Run one execution to completion and return its result.

        Failures of the user's code are reported inside the result (stage statuses);
        a failure of the backend itself sets ``RunResult.error``. Must never share
        mutable state between two tenants.
        """

    def stats(self) -> dict[str, int]:
        """Pool gauges for metrics, e.g. ``{"warm": 4, "busy": 1, "starting": 0}``."""
        return {}

    def inventory(self) -> dict[str, int]:
        """Idle warm workers by pool (``wire.messages.pool_key``), for placement."""
        return {}

    def idle_capacity(self) -> dict[str, IdleCapacity]:
        """Idle capacity each pool held since the previous call (the platform's cost)."""
        return {}

    @abstractmethod
    async def close(self) -> None:
        """Release every resource. Idempotent."""
