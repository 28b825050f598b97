"""The key cache: who a verified credential acts as, trusted for a while without a read.

One cache per gateway serves every surface (the API, E2B, the console's sign-in): an
entry is found by a keyed digest of the credential (BLAKE2b under a secret made for this
process), never by the credential itself, so neither the cache nor a dump of the
process's memory holds a usable key. It is bounded: at most ``size`` entries, the
least recently used going first, and each entry lives ``ttl_s`` at most. ``evict_tenant``
drops a tenant's entries at once (its key revoked, the tenant disabled or changed), and
bumps ``generation`` so that a look-up in flight, which may have read the tenant before
the change, is not stored (``put`` with the generation the look-up started under).
How other gateways learn of a change: ``app.auth.revocations``.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable

from app.auth.principal import Principal

#: Digest of a credential: what the cache keeps instead of it.
Digest = bytes


class KeyCache:
    def __init__(
        self, *, ttl_s: float, size: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl_s = ttl_s
        self._size = size
        self._clock = clock
        self._salt = secrets.token_bytes(32)
        self._entries: OrderedDict[Digest, tuple[float, Principal]] = OrderedDict()
        #: bumped by every eviction: a look-up that started before it is not stored
        self.generation = 0

    def digest(self, credential: str) -> Digest:
        """The name under which ``credential``'s entry is kept."""
        return hashlib.blake2b(credential.encode(), key=self._salt, digest_size=20).digest()

    def get(self, digest: Digest) -> Principal | None:
        hit = self._entries.get(digest)
        if hit is None:
            return None
        if hit[0] <= self._clock():
            del self._entries[digest]
            return None
        self._entries.move_to_end(digest)
        return hit[1]

    def put(self, digest: Digest, principal: Principal, *, generation: int) -> None:
        """Keep ``principal`` under ``digest``, unless the cache is off or an eviction
        happened since ``generation`` was read."""
        if self._ttl_s <= 0 or self._size <= 0 or generation != self.generation:
            return
        self._entries[digest] = (self._clock() + self._ttl_s, principal)
        self._entries.move_to_end(digest)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def evict_tenant(self, tenant_id: str) -> None:
        """Drop every entry of ``tenant_id``; look-ups in flight are not stored."""
        self.generation += 1
        for digest in [d for d, (_, p) in self._entries.items() if p.tenant_id == tenant_id]:
            del self._entries[digest]

    def clear(self) -> None:
        """Drop everything (another gateway announced a change it did not name)."""
        self.generation += 1
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, digest: object) -> bool:
        return digest in self._entries
