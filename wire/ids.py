"""Identifiers: prefixed random strings (``ten_…``, ``key_…``, ``inv_…``) and claim tokens."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


def new_claim() -> str:
    """A fencing token: issued by the control plane each time it hands out an execution."""
    return secrets.token_hex(8)
