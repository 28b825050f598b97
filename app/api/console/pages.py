"""What a sorted list's page shows besides its rows: a link on each column's header
(sorted by it, ascending first) and the links to the next and the first page."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from app.api.console import lists, sorting


def pages(
    base: str, listed: lists.Listed, columns: Mapping[str, Any], cursor: str | None
) -> dict[str, Any]:
    """A list's header links (sort by each column) and its next and first pages."""
    kept = {k: v for k, v in listed.filters.items() if v}
    same = {**kept, "sort": listed.order.param}
    return {
        "sort": {
            name: sorting.header(base, listed.filters, listed.order, name) for name in columns
        },
        "older": (
            f"{base}?{urlencode({**same, 'cursor': listed.following})}"
            if listed.following
            else None
        ),
        "first": f"{base}?{urlencode(same)}" if cursor else None,
    }
