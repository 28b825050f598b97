"""The key cache on its own: entries by a keyed digest, each living its TTL at most,
the least recently used going first past the bound, a tenant's entries evicted at once
and a look-up that started before an eviction not stored."""

from __future__ import annotations

from app.auth.cache import KeyCache
from app.auth.principal import Principal
from app.quotas.spec import QuotaDefaults


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def principal(tenant_id: str) -> Principal:
    return Principal(tenant_id, "key_" + tenant_id, QuotaDefaults().limits())


def test_the_digest_is_keyed_per_cache_and_hides_the_key() -> None:
    one, two = KeyCache(ttl_s=1, size=10), KeyCache(ttl_s=1, size=10)
    key = "crl_key_00000000000000000000_" + "s" * 43
    assert one.digest(key) == one.digest(key)
    assert one.digest(key) != two.digest(key)  # a digest seen in one process is no use elsewhere
    assert key.encode() not in one.digest(key) and b"s" * 8 not in one.digest(key)


def test_an_entry_lives_its_ttl() -> None:
    clock = Clock()
    cache = KeyCache(ttl_s=2, size=10, clock=clock)
    digest = cache.digest("k")
    cache.put(digest, principal("t"), generation=cache.generation)
    clock.now += 1.9
    assert cache.get(digest) == principal("t")
    clock.now += 0.2
    assert cache.get(digest) is None
    assert len(cache) == 0


def test_the_least_recently_used_goes_first_past_the_bound() -> None:
    cache = KeyCache(ttl_s=60, size=2)
    a, b, c = (cache.digest(k) for k in "abc")
    cache.put(a, principal("a"), generation=0)
    cache.put(b, principal("b"), generation=0)
    assert cache.get(a) is not None  # a is now more recent than b
    cache.put(c, principal("c"), generation=0)
    assert (a in cache, b in cache, c in cache) == (True, False, True)
    assert len(cache) == 2


def test_a_tenants_entries_are_evicted_and_a_lookup_from_before_is_not_kept() -> None:
    cache = KeyCache(ttl_s=60, size=10)
    started_under = cache.generation
    cache.put(cache.digest("k1"), principal("t1"), generation=started_under)
    cache.put(cache.digest("k2"), principal("t2"), generation=started_under)
    cache.evict_tenant("t1")
    assert cache.digest("k1") not in cache and cache.digest("k2") in cache
    cache.put(cache.digest("k1"), principal("t1"), generation=started_under)  # read before
    assert cache.digest("k1") not in cache


def test_a_cache_of_size_or_ttl_zero_keeps_nothing() -> None:
    for cache in (KeyCache(ttl_s=0, size=10), KeyCache(ttl_s=10, size=0)):
        cache.put(cache.digest("k"), principal("t"), generation=cache.generation)
        assert len(cache) == 0
