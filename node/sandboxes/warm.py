"""Warm sandboxes: created ahead from an image and kept paused, so a create is a claim.

The shared warm-pool framework (``node.pools``) sizes one key per (backend, image
digest) from the measured arrival rate and start time, within the bounds the node's
settings give each image (``NodeSettings.sandbox_warm``), merges concurrent cold starts,
reaps what sits idle past its timeout, and accounts the idle capacity held. A warm
sandbox belongs to no tenant; it is frozen (no CPU) until a create claims it, when the
backend gives it the request's id, limits, disk and env and thaws it
(``SandboxBackend.claim``). A claimed sandbox leaves the pool for good: the pool's
one-shot ``stop`` of it does nothing. Warm sandboxes are not counted against the memory
and CPU the node gives its sandboxes (``node.sandboxes.manager``): frozen, they hold
what they touched while warming and use nothing more; a claim holds the create's size.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field

from node.pools import Bounds, Pool, PoolConfig, WorkerFactory
from node.sandboxes.base import RootImage, SandboxBackend, SandboxError
from wire.sandboxes import SandboxSpec

log = logging.getLogger(__name__)

#: the shape a warm sandbox is made with; a claim narrows it to the request's
WARM_MEMORY_MB = 512
WARM_DISK_MB = 1024
WARM_TTL_S = 10 * 365 * 86400.0  #: the pool, not a TTL, ends a warm sandbox
REFILL_DELAY_S = 1.0


def warm_spec(backend: str, digest: str, warm_id: str) -> SandboxSpec:
    """What a warm sandbox is made as: the default shape of a create, no tenant's."""
    return SandboxSpec(
        sandbox_id=warm_id,
        tenant_id="warm-pool",
        backend=backend,
        image=digest,
        memory_mb=WARM_MEMORY_MB,
        disk_mb=WARM_DISK_MB,
        ttl_s=WARM_TTL_S,
    )


@dataclass(eq=False)
class WarmSandbox:
    id: str
    key: str
    image: RootImage
    claimed: bool = field(default=False)


class WarmFactory(WorkerFactory[WarmSandbox]):
    one_shot = True

    def __init__(self, backends: dict[str, SandboxBackend], images: dict[str, RootImage]) -> None:
        self._backends = backends
        self._images = images  #: key -> image

    @staticmethod
    def key(backend: str, digest: str) -> str:
        return f"sandbox/{backend}/{digest}"

    async def start(self, key: str) -> WarmSandbox:
        backend_name = key.split("/")[1]
        image = self._images[key]
        warm = WarmSandbox(id=f"warm-{secrets.token_hex(6)}", key=key, image=image)
        spec = warm_spec(backend_name, image.digest, warm.id)
        backend = self._backends[backend_name]
        await backend.create(spec, image)
        try:
            await backend.pause(warm.id)
        except BaseException:
            await backend.destroy(warm.id)
            raise
        return warm

    async def stop(self, worker: WarmSandbox) -> None:
        if worker.claimed:
            return
        try:
            await self._backends[worker.key.split("/")[1]].destroy(worker.id)
        except SandboxError:
            log.warning("warm sandbox %s could not be destroyed", worker.id, exc_info=True)

    def alive(self, worker: WarmSandbox) -> bool:
        return not worker.claimed

    def memory_mb(self, worker: WarmSandbox) -> float:
        return self._backends[worker.key.split("/")[1]].warm_memory_mb


class WarmPool:
    """The node's warm sandboxes, by image."""

    def __init__(
        self,
        backends: dict[str, SandboxBackend],
        targets: dict[str, tuple[str, RootImage, int]],
        *,
        max_warm: int,
    ) -> None:
        """``targets``: key -> (backend, image, minimum warm)."""
        self._images = {key: image for key, (_, image, _) in targets.items()}
        self._backends = backends
        self._factory = WarmFactory(backends, self._images)
        self._pool = Pool(
            self._factory,
            PoolConfig(
                max_workers=max_warm,
                start_timeout_s=60.0,
                acquire_timeout_s=30.0,
                idle_timeout_s=300.0,
                # a claimed sandbox's replacement starts a moment later, not on the same
                # cores at the same time as the claimed sandbox's first commands
                refill_delay_s=REFILL_DELAY_S,
            ),
            name="sandboxes",
        )
        self._bounds = {
            key: Bounds(minimum, max(minimum, max_warm)) for key, (_, _, minimum) in targets.items()
        }

    def offers(self, spec: SandboxSpec, digest: str) -> str | None:
        """The pool key whose warm sandboxes can become ``spec`` (of image ``digest``),
        or None: no pool for the image, or its backend cannot claim one as that
        (``SandboxBackend.claimable``: a microVM keeps its size)."""
        key = WarmFactory.key(spec.backend, digest)
        if key not in self._images:
            return None
        backend = self._backends[spec.backend]
        if not backend.claimable(warm_spec(spec.backend, digest, "warm"), spec):
            return None
        return key

    async def start(self) -> None:
        for key, bounds in self._bounds.items():
            self._pool.declare(key, bounds)
        await self._pool.start()

    async def close(self) -> None:
        await self._pool.close()

    async def take(self, key: str, *, context: str) -> WarmSandbox:
        """A paused warm sandbox, now the caller's (it leaves the pool)."""
        warm = await self._pool.acquire(key, context=context)
        warm.claimed = True
        self._pool.release(warm, context=context)
        return warm

    def inventory(self) -> dict[str, int]:
        return self._pool.inventory()

    def stats(self) -> dict[str, int]:
        """Warm (paused, unclaimed) and starting sandboxes of every image's pool."""
        return self._pool.stats()
