"""A node's function artifacts by digest: fetched once, checked, kept per tenant."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from node.artifacts import Artifacts, ArtifactUnavailable, http_source

MODULE = b"\0asm\x01\0\0\0" + b"x" * 100
DIGEST = hashlib.sha256(MODULE).hexdigest()


class Source:
    def __init__(self, data: bytes = MODULE, *, delay: float = 0.0) -> None:
        self.data = data
        self.delay = delay
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, tenant_id: str, digest: str) -> bytes:
        self.calls.append((tenant_id, digest))
        await asyncio.sleep(self.delay)
        return self.data


async def test_concurrent_gets_fetch_once_and_later_ones_not_at_all() -> None:
    source = Source(delay=0.05)
    artifacts = Artifacts(source)
    got = await asyncio.gather(*(artifacts.get("ten_a", DIGEST) for _ in range(10)))
    assert got == [MODULE] * 10
    assert await artifacts.get("ten_a", DIGEST) == MODULE
    assert source.calls == [("ten_a", DIGEST)]


async def test_bytes_that_are_not_the_digest_are_refused_and_not_kept() -> None:
    source = Source(b"\0asm\x01\0\0\0 something else")
    artifacts = Artifacts(source)
    for _ in range(2):
        with pytest.raises(ArtifactUnavailable, match="not it"):
            await artifacts.get("ten_a", DIGEST)
    assert len(source.calls) == 2


async def test_what_one_tenant_fetched_is_not_answered_to_another() -> None:
    source = Source()
    artifacts = Artifacts(source)
    await artifacts.get("ten_a", DIGEST)
    await artifacts.get("ten_b", DIGEST)
    assert source.calls == [("ten_a", DIGEST), ("ten_b", DIGEST)]


async def test_the_cache_is_bounded() -> None:
    blobs = [b"\0asm" + bytes([n]) * 100 for n in range(4)]
    digests = [hashlib.sha256(b).hexdigest() for b in blobs]
    calls: list[str] = []

    async def source(tenant_id: str, digest: str) -> bytes:
        calls.append(digest)
        return blobs[digests.index(digest)]

    artifacts = Artifacts(source, max_bytes=250)  # two of them
    for digest in digests:
        await artifacts.get("t", digest)
    await artifacts.get("t", digests[3])  # kept
    await artifacts.get("t", digests[0])  # dropped: fetched again
    assert calls == [*digests, digests[0]]


async def test_a_node_without_a_source_says_so() -> None:
    with pytest.raises(ArtifactUnavailable, match="CORRAL_CONTROL_URL"):
        await Artifacts(None).get("t", DIGEST)
    assert http_source([], "token") is None


async def test_a_failing_source_is_unavailable_not_a_crash() -> None:
    async def broken(tenant_id: str, digest: str) -> bytes:
        raise OSError("connection refused")

    with pytest.raises(ArtifactUnavailable, match="connection refused"):
        await Artifacts(broken).get("t", DIGEST)
