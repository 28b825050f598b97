"""Real clients against a real Corral: uvicorn on loopback, the nsjail backend."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import free_port, keyless_url


@pytest.fixture
def sandbox_url(live_server: Callable[..., str]) -> str:
    """The keyless listener of a server with nsjail workers, as `make run` has it (the
    node's slots sized by its memory, the default quotas): the URL verl and the
    sandbox-fusion client are pointed at (they send no key)."""
    port = free_port()
    live_server(runtimes=["nsjail"], default_tenant="default", keyless_port=port, node_slots=0)
    return keyless_url(port)
