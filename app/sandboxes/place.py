"""Where a sandbox lives and whether it runs: what a call routed to its node needs.

Every command, file and process call of a sandbox (the E2B envd API, exec) reads its
record only to check the tenant, find the node and see that it has not stopped. Those
columns come from one ``KeyRead`` (``app.db.reads``), not from an ORM instance of the
whole row (about 0.15 ms less per call on the embedded default; docs/benchmarks-history.md,
"A sandbox's place, read by key").
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Protocol

from app.db.models import Sandbox
from app.db.reads import KeyRead


class Placed(Protocol):
    """What routing a call to a sandbox's node reads of it (a ``Sandbox`` has it too)."""

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def node_id(self) -> str | None: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def spec(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class SandboxPlace:
    id: str
    tenant_id: str
    state: str
    node_id: str | None
    reason: str | None
    spec: dict[str, Any]

    @classmethod
    def of(cls, values: tuple[Any, ...]) -> SandboxPlace:
        return cls(*values)


_COLUMNS = Sandbox.__table__.c
#: the columns of ``SandboxPlace``, in its fields' order
PLACE = KeyRead(_COLUMNS.id, [_COLUMNS[field.name] for field in fields(SandboxPlace)])
