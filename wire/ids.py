"""Identifiers: prefixed random strings (``ten_…``, ``key_…``, ``inv_…``) and claim tokens."""

from __future__ import annotations

import os

# ``os.urandom`` directly: what ``secrets.token_hex`` reads too, without its two layers of
# Python (``SystemRandom.randbytes``), which were 2 % of a busy gateway's event loop.


def new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(10).hex()}"


def new_claim() -> str:
    """A fencing token: issued by the control plane each time it hands out an execution."""
    return os.urandom(8).hex()
