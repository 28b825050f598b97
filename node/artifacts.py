"""Function artifacts by digest: what a node runs for a Job that names one.

A tool function's Job carries its artifact's SHA-256 (``RunSpec.artifact``), not its bytes:
a 120 KB WebAssembly module base64-encoded into every Job was encoded by the gateway,
serialised into the stored row and the dispatch, parsed, decoded and hashed again by the
node, on every call. A runtime asks ``Artifacts.get`` for the bytes only when it lacks
the compiled module (the wasm worker keeps compiled modules by the same digest), so a
warm node touches no bytes at all.

``get`` answers from a bounded in-memory cache (least recently used out), else from the
``source``: the control plane's ``GET /internal/artifacts/{tenant}/{digest}`` with the
node token (``http_source``), or, for the embedded node, the gateway's own record. The
bytes are hashed before they are kept or used: anything that is not the digest asked for
is refused (``ArtifactUnavailable``), so neither a cache nor a source can substitute code.
Concurrent gets of one artifact share one fetch. Entries are keyed by tenant as well:
a Job can only name its own tenant's artifacts, and nothing fetched for one tenant is
answered to another.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import httpx

from common.singleflight import SingleFlight
from wire.execution import ARTIFACT_PATH

log = logging.getLogger(__name__)

#: fetches the bytes of (tenant id, sha256 hex)
Source = Callable[[str, str], Awaitable[bytes]]

#: Bytes of artifacts one node keeps in memory.
CACHE_BYTES = 256 * 1024 * 1024
_TIMEOUT = httpx.Timeout(30.0, connect=5.0)


class ArtifactUnavailable(Exception):
    """The artifact cannot be had: no source, the source failed, or the bytes are not it."""


class Artifacts:
    def __init__(self, source: Source | None, *, max_bytes: int = CACHE_BYTES) -> None:
        self._source = source
        self._max_bytes = max_bytes
        self._bytes = 0
        self._cache: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._fetches: SingleFlight[tuple[str, str], bytes] = SingleFlight("artifact")
        self.fetched = 0  #: fetches from the source (for tests and metrics)

    async def get(self, tenant_id: str, digest: str) -> bytes:
        key = (tenant_id, digest)
        data = self._cache.get(key)
        if data is not None:
            self._cache.move_to_end(key)
            return data
        return await self._fetches.do(key, lambda: self._fetch(key))

    async def _fetch(self, key: tuple[str, str]) -> bytes:
        tenant_id, digest = key
        if self._source is None:
            raise ArtifactUnavailable(
                f"artifact {digest[:12]} is not on this node and it has no control plane "
                "to fetch it from (CORRAL_CONTROL_URL)"
            )
        try:
            data = await self._source(tenant_id, digest)
        except ArtifactUnavailable:
            raise
        except Exception as exc:
            raise ArtifactUnavailable(f"fetching artifact {digest[:12]} failed: {exc!r}") from exc
        if hashlib.sha256(data).hexdigest() != digest:
            log.error("artifact %s: the bytes fetched are not it; refused", digest[:12])
            raise ArtifactUnavailable(f"the bytes fetched for artifact {digest[:12]} are not it")
        self.fetched += 1
        self._keep(key, data)
        log.debug("artifact %s: fetched (%d bytes)", digest[:12], len(data))
        return data

    def _keep(self, key: tuple[str, str], data: bytes) -> None:
        if len(data) > self._max_bytes:
            return
        self._cache[key] = data
        self._bytes += len(data)
        while self._bytes > self._max_bytes:
            _, dropped = self._cache.popitem(last=False)
            self._bytes -= len(dropped)


def http_source(urls: list[str], token: str) -> Source | None:
    """Fetch from the control plane's URLs, tried in order (None: no URL)."""
    bases = [url.rstrip("/") for url in urls]
    if not bases:
        return None
    headers = {"authorization": f"Bearer {token}"}

    async def fetch(tenant_id: str, digest: str) -> bytes:
        failures: list[str] = []
        async with httpx.AsyncClient(timeout=_TIMEOUT, headers=headers) as http:
            for base in bases:
                path = ARTIFACT_PATH.format(tenant_id=tenant_id, digest=digest)
                try:
                    response = await http.get(base + path)
                except httpx.HTTPError as exc:
                    failures.append(f"{base}: {exc!r}")
                    continue
                if response.status_code == 200:
                    return response.content
                failures.append(f"{base}: HTTP {response.status_code}")
        raise ArtifactUnavailable(f"artifact {digest[:12]}: " + "; ".join(failures))

    return fetch
