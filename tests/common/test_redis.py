"""How both planes connect to Redis: one client serves many commands at once."""

from __future__ import annotations

import asyncio

import pytest

from common.redis import connect

pytestmark = pytest.mark.redis


async def test_a_batch_of_concurrent_commands_is_not_refused_a_connection(
    redis_url: str,
) -> None:
    """Each command in flight holds a connection; a batch of 100+ calls has more in
    flight than redis-py's default pool of 100, which raised MaxConnectionsError."""
    client = connect(redis_url)
    try:
        pongs = await asyncio.gather(*(client.ping() for _ in range(300)))
    finally:
        await client.aclose()
    assert pongs == [True] * 300
