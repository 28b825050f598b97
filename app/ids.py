"""Random, prefixed identifiers: ``ten_…``, ``key_…``, ``inv_…``."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"
