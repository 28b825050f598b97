"""Real clients against a real Corral: uvicorn on loopback, the nsjail backend."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.settings import Settings
from tests.conftest import free_port, keyless_url

#: How long the gateway waits for a node's report before it counts the node dead, as
#: `make run` has it. The other tests' second is for failing over quickly; under verl's
#: burst of runaway programs it once (in a full CI run) judged the embedded node dead:
#: a request found no report younger than a second (what held the report up was not
#: found).
DEAD_AFTER_S = Settings.model_fields["node_dead_after_seconds"].default


@pytest.fixture
def sandbox_url(live_server: Callable[..., str]) -> str:
    """The keyless listener of a server with nsjail workers, as `make run` has it (the
    node's slots sized by its memory, the default quotas, a node counted dead after
    ``DEAD_AFTER_S``): the URL verl and the sandbox-fusion client are pointed at (they
    send no key)."""
    port = free_port()
    live_server(
        runtimes=["nsjail"],
        default_tenant="default",
        keyless_port=port,
        node_slots=0,
        node_dead_after_seconds=DEAD_AFTER_S,
    )
    return keyless_url(port)
