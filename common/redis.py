"""How both planes connect to Redis.

A Redis that restarts (or fails over) closes every connection; a command that meets a
closed connection reconnects and is tried again, backing off, before its caller sees an
error. Retrying can repeat a command whose reply was lost: every write Corral makes is
safe to repeat (a repeated Job is claimed at most once, a repeated result is stored at
most once, acknowledgements and deletes are idempotent).
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError

RETRIES = 6
#: Connections one process may open. redis-py's default, 100, is fewer than one batch of
#: calls (verl sends 100 cases at once, each its own commands) and what the background
#: tasks hold: the pool raised MaxConnectionsError, a 503 to a valid batch (CI,
#: 2026-12-02). Redis itself accepts 10,000 clients.
MAX_CONNECTIONS = 1024


def connect(url: str) -> Redis:
    return Redis.from_url(
        url,
        decode_responses=True,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.02), RETRIES),
        retry_on_error=[ConnectionError, TimeoutError],
        health_check_interval=30,
        max_connections=MAX_CONNECTIONS,
    )
