"""Real clients against a real Corral: uvicorn on loopback, the nsjail backend."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture
def sandbox_url(live_server: Callable[..., str]) -> str:
    """A server with nsjail workers and keyless loopback access, as `make run` has it (the
    node's slots sized by its memory, the default quotas)."""
    return live_server(runtimes=["nsjail"], default_tenant="default", node_slots=0)
