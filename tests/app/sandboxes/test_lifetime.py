"""The lifetime quota's arithmetic: a create's TTL and a timeout, against the deadline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.errors import LifetimeTooLong
from app.sandboxes.lifetime import create_ttl, timeout_ttl

CREATED = datetime(2030, 1, 1, tzinfo=UTC)


def test_a_create_gets_what_it_asks_up_to_the_limit_and_a_default_within_it() -> None:
    assert create_ttl(60.0, 120.0) == 60.0
    assert create_ttl(120.0, 120.0) == 120.0
    assert create_ttl(None, 120.0) == 120.0  # the default (300) cut to the limit
    assert create_ttl(None, 3600.0) == 300.0
    with pytest.raises(LifetimeTooLong) as refused:
        create_ttl(120.5, 120.0)
    assert refused.value.code == "lifetime_too_long" and refused.value.status == 422


def test_a_timeout_may_end_the_sandbox_at_its_deadline_and_no_later() -> None:
    later = CREATED + timedelta(seconds=100)
    assert timeout_ttl(CREATED, 20.0, 120.0, later) == 20.0
    with pytest.raises(LifetimeTooLong) as refused:
        timeout_ttl(CREATED, 20.5, 120.0, later)
    assert refused.value.details["ttl_s_at_most"] == 20.0
    assert refused.value.details["ends_by"] == (CREATED + timedelta(seconds=120)).isoformat()
    with pytest.raises(LifetimeTooLong):  # past the deadline, any timeout is refused
        timeout_ttl(CREATED, 1.0, 120.0, CREATED + timedelta(seconds=121))
