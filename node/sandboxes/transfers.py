"""How many file transfers a node runs at once: per tenant, and in all.

A transfer (a download, an upload, a page of a listing) holds a connection, a pipe, a
child in the sandbox and the node's chunk buffers while it runs. Past ``per_tenant`` of
one tenant's, or ``per_node`` in all, the next one is refused at once with
``TooManyTransfers`` (429 ``too_many_transfers``, Retry-After): a queue would hold memory
and connections for callers that can retry, and one tenant's burst would wait in front of
another's.
"""

from __future__ import annotations

import logging
from collections import Counter
from types import TracebackType

from node.sandboxes.base import TooManyTransfers

log = logging.getLogger(__name__)

PER_TENANT = 8
PER_NODE = 64


class Slot:
    """One running transfer's place; ``release`` (or the ``with`` block's end) frees it,
    once whatever happens."""

    def __init__(self, slots: TransferSlots, tenant_id: str) -> None:
        self._slots: TransferSlots | None = slots
        self._tenant_id = tenant_id

    def release(self) -> None:
        slots, self._slots = self._slots, None
        if slots is not None:
            slots._release(self._tenant_id)

    def __enter__(self) -> Slot:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class TransferSlots:
    def __init__(self, *, per_tenant: int = PER_TENANT, per_node: int = PER_NODE) -> None:
        self.per_tenant = per_tenant
        self.per_node = per_node
        self._running: Counter[str] = Counter()
        self._total = 0

    def take(self, tenant_id: str) -> Slot:
        """A place for one of ``tenant_id``'s transfers, or ``TooManyTransfers``."""
        if self._running[tenant_id] >= self.per_tenant:
            raise TooManyTransfers(
                f"the tenant has {self.per_tenant} file transfers running on this node; "
                "retry when one ends"
            )
        if self._total >= self.per_node:
            log.debug("tenant=%s: file transfer refused, the node runs %d", tenant_id, self._total)
            raise TooManyTransfers(
                f"this node runs its most file transfers ({self.per_node}); retry shortly"
            )
        self._running[tenant_id] += 1
        self._total += 1
        return Slot(self, tenant_id)

    def running(self, tenant_id: str | None = None) -> int:
        return self._total if tenant_id is None else self._running[tenant_id]

    def _release(self, tenant_id: str) -> None:
        self._running[tenant_id] -= 1
        if self._running[tenant_id] <= 0:
            del self._running[tenant_id]
        self._total -= 1
