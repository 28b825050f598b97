"""Quota counters in Redis, shared by every gateway. Each step is one Lua script."""

from __future__ import annotations

import asyncio
import time

from redis.asyncio import Redis

from app.quotas.counters import Bucket, QuotaCounters
from wire import keys

# KEYS[1] bucket hash; ARGV rate, burst, max_wait, now. Returns wait in ms or -1.
_RESERVE_TOKEN = """
local rate = tonumber(ARGV[1]); local burst = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3]); local now = tonumber(ARGV[4])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1]) or burst
local ts = tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
if tokens - 1 < -rate * max_wait then
  redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
  return -1
end
tokens = tokens - 1
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst / rate + max_wait) * 1000) + 1000)
if tokens >= 0 then return 0 end
return math.ceil(-tokens / rate * 1000)
"""

# KEYS[1] leases zset; ARGV limit, lease id, now, expiry. Returns 1 if acquired.
_ACQUIRE_SLOT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[2])
-- The key lives as long as its longest lease, never shorter.
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], math.ceil(tonumber(last[2]) * 1000))
return 1
"""

# KEYS[1] waiting zset (entry -> expiry); ARGV depth, entry id, now, expiry. 1 if entered.
_ENTER_QUEUE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[2])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], math.ceil(tonumber(last[2]) * 1000))
return 1
"""

#: How often a request over its concurrency quota looks for a free slot.
_SLOT_POLL_S = 0.005


class RedisCounters(QuotaCounters):
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._reserve = redis.register_script(_RESERVE_TOKEN)
        self._acquire = redis.register_script(_ACQUIRE_SLOT)
        self._enter = redis.register_script(_ENTER_QUEUE)
        self._local_waiting = 0

    async def reserve_token(
        self,
        tenant_id: str,
        *,
        rate: float,
        burst: int,
        max_wait: float,
        bucket: Bucket = "executions",
    ) -> float | None:
        key = (
            keys.quota_tokens(tenant_id)
            if bucket == "executions"
            else keys.quota_sandbox_call_tokens(tenant_id)
        )
        wait_ms = int(await self._reserve(keys=[key], args=[rate, burst, max_wait, time.time()]))
        return None if wait_ms < 0 else wait_ms / 1000.0

    async def try_acquire_slot(
        self, tenant_id: str, *, limit: int, lease_id: str, ttl: float
    ) -> bool:
        now = time.time()
        acquired = await self._acquire(
            keys=[keys.quota_slots(tenant_id)], args=[limit, lease_id, now, now + ttl]
        )
        return bool(acquired)

    async def release_slot(self, tenant_id: str, *, lease_id: str) -> None:
        await self._redis.zrem(keys.quota_slots(tenant_id), lease_id)

    async def wait_for_slot(self, tenant_id: str, timeout: float) -> None:
        # Slots are freed by any gateway; a short poll is simpler than pub/sub and the
        # wait only happens when a tenant is over its concurrency quota.
        await asyncio.sleep(min(timeout, _SLOT_POLL_S))

    async def enter_queue(self, tenant_id: str, *, depth: int, entry_id: str, ttl: float) -> bool:
        now = time.time()
        entered = bool(
            await self._enter(
                keys=[keys.quota_waiting(tenant_id)], args=[depth, entry_id, now, now + ttl]
            )
        )
        if entered:
            self._local_waiting += 1
        return entered

    async def leave_queue(self, tenant_id: str, *, entry_id: str) -> None:
        self._local_waiting = max(0, self._local_waiting - 1)
        await self._redis.zrem(keys.quota_waiting(tenant_id), entry_id)

    async def waiting(self) -> int:
        return self._local_waiting

    async def count_throttle(self, tenant_id: str, quota: str, outcome: str) -> None:
        await self._redis.hincrby(keys.quota_throttled(tenant_id), f"{quota}:{outcome}", 1)

    async def throttles(self, tenant_id: str) -> dict[str, int]:
        counts = await self._redis.hgetall(keys.quota_throttled(tenant_id))
        return {str(k): int(v) for k, v in counts.items()}
