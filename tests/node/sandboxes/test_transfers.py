"""The node's bounds on concurrent file transfers."""

from __future__ import annotations

import pytest

from node.sandboxes.base import TooManyTransfers
from node.sandboxes.transfers import TransferSlots


def test_a_tenant_past_its_bound_is_refused_and_its_neighbour_is_not() -> None:
    slots = TransferSlots(per_tenant=2, per_node=3)
    held = [slots.take("a"), slots.take("a")]
    with pytest.raises(TooManyTransfers) as refused:
        slots.take("a")
    assert refused.value.status == 429 and refused.value.headers() == {"Retry-After": "1"}
    neighbour = slots.take("b")
    with pytest.raises(TooManyTransfers, match="this node runs its most"):
        slots.take("c")  # the node's bound, whoever asks
    held[0].release()
    held[0].release()  # once only
    assert slots.running("a") == 1 and slots.running() == 2
    with slots.take("c"):
        assert slots.running() == 3
    assert slots.running("c") == 0
    neighbour.release()
    held[1].release()
    assert slots.running() == 0
