"""A sandbox's lifetime quota: from its creation to its expiry, at most the tenant's
``max_sandbox_lifetime_seconds``.

The limit is read from the caller's quota at each request, so a quota raised by the
admin applies at once to the tenant's live sandboxes (and one lowered does not shorten
them: it refuses their next extension). A create that asks for a longer ``ttl_s`` is
refused; one that does not ask gets the default TTL or the limit, the shorter. A timeout
(``ttl_s`` from now) that would end the sandbox after ``created_at`` plus the limit is
refused. The node counts a TTL from its own clock when it acts on the request, so the
expiry it records can pass that moment by the time the node takes to act (a create's
image lookup, a call's latency); the gateway never asks for more.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from app.errors import LifetimeTooLong
from app.schemas.sandboxes import DEFAULT_TTL_S


def create_ttl(requested: float | None, limit_s: float) -> float:
    """The TTL of a new sandbox: ``requested`` (refused above the limit), else the default
    or the limit, the shorter."""
    if requested is None:
        return min(DEFAULT_TTL_S, limit_s)
    if requested > limit_s:
        raise LifetimeTooLong(
            f"ttl_s {requested:g} is over the tenant's max_sandbox_lifetime_seconds {limit_s:g}",
            details={"max_sandbox_lifetime_seconds": limit_s},
        )
    return requested


def deadline(created_at: datetime, limit_s: float) -> datetime:
    """The latest moment a sandbox created at ``created_at`` may end."""
    return created_at + timedelta(seconds=limit_s)


def left_s(created_at: datetime, limit_s: float, now: datetime) -> float:
    """Seconds from ``now`` to the deadline (negative past it)."""
    return (deadline(created_at, limit_s) - now).total_seconds()


def timeout_ttl(created_at: datetime, ttl_s: float, limit_s: float, now: datetime) -> float:
    """``ttl_s`` for a timeout set at ``now``, unless it would pass the deadline."""
    left = left_s(created_at, limit_s, now)
    if ttl_s > left:
        ends_by = deadline(created_at, limit_s)
        raise LifetimeTooLong(
            f"a timeout of {ttl_s:g}s would end the sandbox after {ends_by.isoformat()}, its "
            f"creation plus the tenant's max_sandbox_lifetime_seconds {limit_s:g}",
            details={
                "max_sandbox_lifetime_seconds": limit_s,
                "ends_by": ends_by.isoformat(),
                "ttl_s_at_most": max(0.0, left),
            },
        )
    return ttl_s
