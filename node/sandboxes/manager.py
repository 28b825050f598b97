"""The sandboxes one node holds: their statuses, lifetimes and backends.

The manager is the node's only owner of sandboxes. It creates them through a backend,
keeps each one's status (``wire.sandboxes.SandboxStatus``), destroys those past their
TTL or idle timeout (a reaper loop, so an abandoned sandbox is freed even if no gateway
ever asks), and at start-up takes back what a previous node process left running: a
sandbox whose saved spec it can read is adopted as it is (running or paused), anything
else the backend holds is destroyed. So no sandbox outlives its node's knowledge of it;
the gateway's reconciler compares that knowledge (``inventory``) with its records,
and the reaper reads each live sandbox's usage (memory, CPU, disk) every
``USAGE_EVERY_S`` into its status, so the inventory carries the CPU the tenant's daily
quota is charged (and a destroy reads it a last time first).

Capacity: the sandboxes a node holds keep within ``CreateLimits``: a number, and the
memory and CPU their limits add up to (``memory_mb``, ``cpu``: the node's
``sandbox_memory_mb`` and ``sandbox_cpu``). A create holds its size from before its first
wait to its end (``_hold``, synchronous with the check: two creates racing cannot both
take the last room), and one that does not fit fails at once with ``NodeFull`` (503
no_capacity; placement, which reads the node's report, tries to send it where it fits).
Warm sandboxes (``node.sandboxes.warm``) are not counted: they are frozen with what
they touched while warming (a few MiB, their pool's ``memory_mb``) and use nothing more
until a create claims one, which holds the create's own memory like a cold create.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from node.sandboxes.base import (
    BackendUnavailable,
    NodeFull,
    Process,
    RootImage,
    SandboxBackend,
    SandboxError,
    SandboxNotFound,
    SandboxNotRunning,
    SnapshotInUse,
    SnapshotNotFound,
)
from node.sandboxes.warm import WarmFactory, WarmPool
from wire.sandboxes import (
    ExecRequest,
    Phases,
    SandboxSpec,
    SandboxState,
    SandboxStatus,
    SnapshotInfo,
)

log = logging.getLogger(__name__)

REAP_EVERY_S = 1.0
#: how often the reaper reads the usage (CPU, memory, disk) of every live sandbox
USAGE_EVERY_S = 10.0
#: why a sandbox whose init ended is destroyed (its record says so)
BROKEN = "broken: its init ended (killed when its memory was full)"
#: a stopped sandbox's status is kept this long, so that a gateway learns why it ended
STOPPED_KEPT_S = 600.0


@dataclass(frozen=True)
class CreateLimits:
    """How many sandboxes a node holds, and how a burst of creates is admitted: at most
    ``concurrency`` are made at once, at most ``queue`` more wait, each at most
    ``wait_s``; beyond that a create fails at once with ``NodeFull`` (503 no_capacity)."""

    max_sandboxes: int = 4096
    concurrency: int = 8
    queue: int = 256
    wait_s: float = 30.0
    memory_mb: int | None = None  #: what the sandboxes' memory limits add up to at most
    cpu: float | None = None  #: what their CPU quotas add up to at most


@dataclass(frozen=True)
class Capacity:
    """What the node gives sandboxes and what of it is free (for its report)."""

    memory_mb: int | None
    memory_free_mb: int
    cpu: float | None
    cpu_free: float


@dataclass
class _Entry:
    spec: SandboxSpec
    status: SandboxStatus
    backend: SandboxBackend
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: every process of it ended, its init too: nothing can run in it again
    broken: bool = False


class SandboxManager:
    def __init__(
        self,
        backends: dict[str, SandboxBackend],
        resolve_image: Callable[[str], RootImage],
        *,
        state_dir: Path,
        clock: Callable[[], float] = time.time,
        warm: dict[str, int] | None = None,
        max_warm: int = 64,
        limits: CreateLimits | None = None,
    ) -> None:
        self.backends = backends
        self._resolve_image = resolve_image
        self._state_dir = state_dir
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._closers: list[Callable[[], None]] = []
        self._lock_fd: int | None = None
        self._snapshots_dir = state_dir / "snapshots"
        self._reaper: asyncio.Task[None] | None = None
        self._warm_wanted = dict(warm or {})  #: image ref -> warm sandboxes at least
        self._max_warm = max_warm
        self._warm: WarmPool | None = None
        self.limits = limits or CreateLimits()
        self._create_slots = asyncio.Semaphore(self.limits.concurrency)
        self._queued = 0
        self._resolving: dict[str, asyncio.Future[RootImage]] = {}
        self._holds: dict[str, SandboxSpec] = {}  #: creates under way, by sandbox id
        self._usage_read_at = -1e18

    # --- start and stop -------------------------------------------------------------------
    async def start(self) -> None:
        self._state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._hold_state_dir()
        for name, backend in self.backends.items():
            survivors = set(await backend.start())
            for saved in sorted(self._state_dir.glob("*.json")):
                with contextlib.suppress(OSError, ValueError):
                    status = SandboxStatus.model_validate_json(saved.read_text())
                    if status.backend != name:
                        continue
                    spec = SandboxSpec.model_validate_json(saved.with_suffix(".spec").read_text())
                    if status.sandbox_id in survivors:
                        self._entries[status.sandbox_id] = _Entry(spec, status, backend)
                        log.info("sandbox=%s: adopted after a node restart", status.sandbox_id)
                        continue
                self._forget(saved.stem)
            for orphan in survivors - set(self._entries):
                log.warning("sandbox=%s: no saved record; destroying it", orphan)
                with contextlib.suppress(SandboxError):
                    await backend.destroy(orphan)
        self._reaper = asyncio.create_task(self._reap_loop(), name="sandbox-reaper")
        if self._warm_wanted:
            targets = {}
            for ref, count in self._warm_wanted.items():
                image = await self._image(ref)
                for name in self.backends:
                    targets[WarmFactory.key(name, image.digest)] = (name, image, count)
            self._warm = WarmPool(self.backends, targets, max_warm=self._max_warm)
            await self._warm.start()

    def _hold_state_dir(self) -> None:
        """One manager per state dir: a second node started on the same data dir would
        take the first's sandboxes for orphans and destroy them. The lock goes with the
        process (a killed node's successor gets it at once)."""
        fd = os.open(self._state_dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BackendUnavailable(
                f"another node holds {self._state_dir} (one node per data dir)"
            ) from None
        self._lock_fd = fd

    def on_close(self, callback: Callable[[], None]) -> None:
        """Have ``close`` call ``callback`` first (tables of the node's API that hold
        resources of their own: directory watches)."""
        self._closers.append(callback)

    async def close(self) -> None:
        """Stop the reaper; sandboxes keep running (a restarted node adopts them)."""
        for callback in self._closers:
            callback()
        if self._warm is not None:
            await self._warm.close()  # destroys the warm sandboxes no one claimed
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for backend in self.backends.values():
            await backend.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def destroy_all(self, reason: str) -> None:
        for sandbox_id in list(self._entries):
            with contextlib.suppress(SandboxError):
                await self.destroy(sandbox_id, reason=reason)

    # --- lifecycle ------------------------------------------------------------------------
    async def create(self, spec: SandboxSpec) -> SandboxStatus:
        if spec.sandbox_id in self._entries:
            return self._entries[spec.sandbox_id].status  # a retried create
        self._hold(spec)
        try:
            async with self._admitted():
                return await self._create(spec)
        finally:
            self._holds.pop(spec.sandbox_id, None)

    def _hold(self, spec: SandboxSpec) -> None:
        """Count the create's memory and CPU as held, if they fit (else ``NodeFull``).
        No await between the check and the hold: creates racing take turns."""
        memory, cpu = self.held()
        limits = self.limits
        if limits.memory_mb is not None and memory + spec.memory_mb > limits.memory_mb:
            raise NodeFull(
                f"this node's sandboxes hold {memory} MiB of its {limits.memory_mb} MiB for "
                f"sandboxes: no room for {spec.memory_mb} MiB more"
            )
        if limits.cpu is not None and cpu + spec.cpu > limits.cpu + 1e-9:
            raise NodeFull(
                f"this node's sandboxes hold {cpu:g} of its {limits.cpu:g} CPU for "
                f"sandboxes: no room for {spec.cpu:g} more"
            )
        self._holds[spec.sandbox_id] = spec

    def held(self) -> tuple[int, float]:
        """Memory (MiB) and CPU the live sandboxes and the creates under way hold."""
        specs = [
            e.spec for e in self._entries.values() if e.status.state is not SandboxState.STOPPED
        ]
        specs += [held for sid, held in self._holds.items() if sid not in self._entries]
        return sum(s.memory_mb for s in specs), sum(s.cpu for s in specs)

    def capacity(self) -> Capacity:
        memory, cpu = self.held()
        limits = self.limits
        return Capacity(
            memory_mb=limits.memory_mb,
            memory_free_mb=max(0, (limits.memory_mb or 0) - memory),
            cpu=limits.cpu,
            cpu_free=max(0.0, (limits.cpu or 0.0) - cpu),
        )

    @contextlib.asynccontextmanager
    async def _admitted(self) -> AsyncIterator[None]:
        """A place among the creates running now, after a bounded wait in a bounded queue."""
        if self.live_count() >= self.limits.max_sandboxes:
            raise NodeFull(f"this node holds its most sandboxes ({self.limits.max_sandboxes})")
        if self._queued >= self.limits.queue:
            raise NodeFull(f"{self._queued} creates already wait on this node")
        self._queued += 1
        try:
            await asyncio.wait_for(self._create_slots.acquire(), self.limits.wait_s)
        except TimeoutError:
            raise NodeFull(f"no create slot on this node within {self.limits.wait_s:g} s") from None
        finally:
            self._queued -= 1
        try:
            yield
        finally:
            self._create_slots.release()

    def room(self) -> int:
        """Sandboxes this node can still take (for its report)."""
        return max(0, self.limits.max_sandboxes - self.live_count())

    async def _create(self, spec: SandboxSpec) -> SandboxStatus:
        backend = self.backends.get(spec.backend)
        if backend is None:
            raise SandboxError(f"this node has no {spec.backend!r} sandbox backend")
        began = time.monotonic()
        if spec.snapshot_id is not None:
            snapshot = self._snapshot(spec.snapshot_id, tenant_id=spec.tenant_id)
            base = await self._image(snapshot.image_digest)
            image = dataclasses.replace(base, layers=self._layers(backend, spec.snapshot_id))
        else:
            image = await self._image(spec.image)
        image_ms = (time.monotonic() - began) * 1000
        now = self._clock()
        status = SandboxStatus(
            sandbox_id=spec.sandbox_id,
            tenant_id=spec.tenant_id,
            backend=spec.backend,
            image_digest=image.digest,
            state=SandboxState.CREATING,
            created_at=now,
            expires_at=now + spec.ttl_s,
            last_active_at=now,
            accelerator=backend.accelerator,
        )
        entry = _Entry(spec, status, backend)
        self._entries[spec.sandbox_id] = entry
        async with entry.lock:
            self._save(entry)
            try:
                phases = await self._make(backend, spec, image)
            except BaseException:
                self._entries.pop(spec.sandbox_id, None)
                self._forget(spec.sandbox_id)
                raise
            status.phases = Phases(
                image_ms=image_ms, setup_ms=phases.setup_ms, start_ms=phases.start_ms
            )
            status.state = SandboxState.RUNNING
            self._save(entry)
        log.info(
            "sandbox=%s tenant=%s: created from %s in %.1f ms",
            spec.sandbox_id,
            spec.tenant_id,
            image.digest[:19],
            image_ms + phases.setup_ms + phases.start_ms,
        )
        return status

    async def _image(self, ref: str) -> RootImage:
        """The image ``ref``, resolved on a thread (it may be fetched from the control
        plane); creates that need one ref at once share one resolve, so a missing image
        is fetched once and the creates waiting for it hold no threads."""
        shared = self._resolving.get(ref)
        if shared is None:
            shared = asyncio.ensure_future(asyncio.to_thread(self._resolve_image, ref))
            self._resolving[ref] = shared
            shared.add_done_callback(lambda done: self._resolved(ref, done))
        return await asyncio.shield(shared)

    def _resolved(self, ref: str, done: asyncio.Future[RootImage]) -> None:
        if self._resolving.get(ref) is done:
            del self._resolving[ref]
        if not done.cancelled():
            done.exception()  # retrieved: every waiter may have gone

    async def _make(self, backend: SandboxBackend, spec: SandboxSpec, image: RootImage) -> Phases:
        """A claim of a warm sandbox of the image when the pool has one for it (the
        ``setup`` phase is the take, ``start`` the claim), else a cold create."""
        key = None
        if self._warm is not None and spec.snapshot_id is None:
            key = self._warm.offers(spec, image.digest)
        if key is None:
            return await backend.create(spec, image)
        began = time.monotonic()
        assert self._warm is not None
        warm = await self._warm.take(key, context=f"sandbox={spec.sandbox_id}")
        taken = time.monotonic()
        try:
            await backend.claim(warm.id, spec)
        except BaseException:
            await asyncio.shield(backend.destroy(warm.id))
            raise
        return Phases(setup_ms=(taken - began) * 1000, start_ms=(time.monotonic() - taken) * 1000)

    def warm_inventory(self) -> dict[str, int]:
        return self._warm.inventory() if self._warm is not None else {}

    def pool_stats(self) -> dict[str, int]:
        """Sandboxes warm and starting in the warm pool, and live ones as busy."""
        stats = self._warm.stats() if self._warm is not None else {"warm": 0, "starting": 0}
        return {"warm": stats["warm"], "busy": self.live_count(), "starting": stats["starting"]}

    async def destroy(self, sandbox_id: str, *, reason: str = "destroyed") -> SandboxStatus:
        entry = self._get(sandbox_id)
        async with entry.lock:
            if entry.status.state is not SandboxState.STOPPED:
                await self._read_usage(entry)  # its last CPU reading, for its tenant's quota
                await entry.backend.destroy(sandbox_id)
                entry.status.state = SandboxState.STOPPED
                entry.status.reason = reason
                entry.status.expires_at = self._clock()
                self._forget(sandbox_id)
                log.info("sandbox=%s: stopped (%s)", sandbox_id, reason)
        return entry.status

    async def pause(self, sandbox_id: str) -> SandboxStatus:
        entry = self._live(sandbox_id)
        async with entry.lock:
            if entry.status.state is SandboxState.RUNNING:
                await entry.backend.pause(sandbox_id)
                entry.status.state = SandboxState.PAUSED
                self._touch(entry)
                self._save(entry)
        return entry.status

    async def resume(self, sandbox_id: str) -> SandboxStatus:
        entry = self._live(sandbox_id)
        async with entry.lock:
            if entry.status.state is SandboxState.PAUSED:
                await entry.backend.resume(sandbox_id)
                entry.status.state = SandboxState.RUNNING
            self._touch(entry)
            self._save(entry)
        return entry.status

    async def set_timeout(self, sandbox_id: str, ttl_s: float) -> SandboxStatus:
        """The sandbox now ends ``ttl_s`` from now."""
        entry = self._live(sandbox_id)
        entry.status.expires_at = self._clock() + ttl_s
        self._touch(entry)
        self._save(entry)
        return entry.status

    # --- use ------------------------------------------------------------------------------
    async def exec(self, sandbox_id: str, request: ExecRequest) -> Process:
        entry = self._live(sandbox_id)
        if entry.status.state is not SandboxState.RUNNING:
            raise SandboxNotRunning(f"sandbox {sandbox_id} is {entry.status.state}")
        self._touch(entry)
        return await entry.backend.exec(sandbox_id, request, default_user=entry.spec.user)

    def backend_of(self, sandbox_id: str) -> tuple[SandboxBackend, SandboxSpec]:
        """For file operations: the sandbox's backend and spec (and the sandbox is used)."""
        entry = self._live(sandbox_id)
        self._touch(entry)
        return entry.backend, entry.spec

    async def status(self, sandbox_id: str) -> SandboxStatus:
        entry = self._get(sandbox_id)
        await self._read_usage(entry)
        return entry.status

    async def _read_usage(self, entry: _Entry) -> None:
        """The backend's usage readings of a live sandbox, into its status."""
        if entry.status.state not in (SandboxState.RUNNING, SandboxState.PAUSED):
            return
        with contextlib.suppress(SandboxError):
            usage = await entry.backend.usage(entry.spec.sandbox_id)
            entry.status.memory_bytes = usage.memory_bytes
            entry.status.cpu_ms = usage.cpu_ms
            entry.status.disk_bytes = usage.disk_bytes
            if usage.ended and entry.status.state is SandboxState.RUNNING:
                entry.broken = True  # the reaper destroys it, saying why

    async def read_usage(self) -> None:
        """Read the usage of every live sandbox (the reaper does, every USAGE_EVERY_S)."""
        for entry in list(self._entries.values()):
            await self._read_usage(entry)

    def inventory(self) -> list[SandboxStatus]:
        return [entry.status for entry in self._entries.values()]

    def accelerators(self) -> dict[str, str]:
        """What runs each machine-backed backend's sandboxes (``{"microvm": "tcg"}``)."""
        return {
            name: accelerator
            for name, backend in sorted(self.backends.items())
            if (accelerator := backend.accelerator) is not None
        }

    def live_count(self) -> int:
        return sum(1 for e in self._entries.values() if e.status.state is not SandboxState.STOPPED)

    # --- snapshots ------------------------------------------------------------------------
    async def snapshot(self, sandbox_id: str, snapshot_id: str) -> SnapshotInfo:
        """Copy a sandbox's files (not its processes) as ``snapshot_id``."""
        entry = self._live(sandbox_id)
        async with entry.lock:
            files = await entry.backend.snapshot(sandbox_id, snapshot_id)
        info = SnapshotInfo(
            snapshot_id=snapshot_id,
            sandbox_id=sandbox_id,
            tenant_id=entry.spec.tenant_id,
            backend=entry.spec.backend,
            image_digest=entry.status.image_digest,
            parent_snapshot_id=entry.spec.snapshot_id,
            size_bytes=files.size_bytes,
            created_at=self._clock(),
        )
        self._snapshots_dir.mkdir(exist_ok=True, mode=0o700)
        path = self._snapshots_dir / f"{snapshot_id}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(info.model_dump_json())
        tmp.replace(path)
        self._touch(entry)
        return info

    def snapshots(self) -> list[SnapshotInfo]:
        found = []
        for path in sorted(self._snapshots_dir.glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                found.append(SnapshotInfo.model_validate_json(path.read_text()))
        return found

    async def delete_snapshot(self, snapshot_id: str, *, tenant_id: str) -> None:
        info = self._snapshot(snapshot_id, tenant_id=tenant_id)
        users = [
            e.spec.sandbox_id
            for e in self._entries.values()
            if e.status.state is not SandboxState.STOPPED
            and snapshot_id in self._chain(e.spec.snapshot_id)
        ]
        children = [s.snapshot_id for s in self.snapshots() if s.parent_snapshot_id == snapshot_id]
        if users or children:
            raise SnapshotInUse(
                f"snapshot {snapshot_id} is the base of sandboxes {users} or snapshots {children}"
            )
        await self.backends[info.backend].delete_snapshot(snapshot_id)
        (self._snapshots_dir / f"{snapshot_id}.json").unlink(missing_ok=True)

    def _snapshot(self, snapshot_id: str, *, tenant_id: str) -> SnapshotInfo:
        try:
            text = (self._snapshots_dir / f"{snapshot_id}.json").read_text()
        except (OSError, ValueError):
            raise SnapshotNotFound(f"no snapshot {snapshot_id} on this node") from None
        info = SnapshotInfo.model_validate_json(text)
        if info.tenant_id != tenant_id:
            raise SnapshotNotFound(f"no snapshot {snapshot_id} on this node")
        return info

    def _chain(self, snapshot_id: str | None) -> list[str]:
        """``snapshot_id`` and the snapshots below it, topmost first."""
        chain: list[str] = []
        while snapshot_id is not None and snapshot_id not in chain:
            chain.append(snapshot_id)
            path = self._snapshots_dir / f"{snapshot_id}.json"
            try:
                snapshot_id = SnapshotInfo.model_validate_json(path.read_text()).parent_snapshot_id
            except (OSError, ValueError):
                break
        return chain

    def _layers(self, backend: SandboxBackend, snapshot_id: str) -> tuple[Path, ...]:
        layers = []
        for sid in self._chain(snapshot_id):
            files = backend.snapshot_layer(sid)
            if files is None:
                raise SnapshotNotFound(f"snapshot {sid}'s files are gone from this node")
            layers.append(files.layer)
        return tuple(layers)

    # --- reaping --------------------------------------------------------------------------
    async def reap(self) -> None:
        """Destroy sandboxes past their TTL or idle timeout; drop old stopped statuses."""
        now = self._clock()
        for sandbox_id, entry in list(self._entries.items()):
            status, spec = entry.status, entry.spec
            if status.state is SandboxState.STOPPED:
                if now - status.expires_at > STOPPED_KEPT_S:
                    self._entries.pop(sandbox_id, None)
                continue
            if status.state is SandboxState.CREATING:
                continue
            reason = None
            if entry.broken:
                reason = BROKEN
            elif now >= status.expires_at:
                reason = "expired"
            elif spec.idle_timeout_s is not None and now - status.last_active_at >= (
                spec.idle_timeout_s
            ):
                reason = "idle"
            if reason is not None:
                try:
                    await self.destroy(sandbox_id, reason=reason)
                except SandboxError:
                    log.exception("sandbox=%s: could not be reaped (%s)", sandbox_id, reason)

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(REAP_EVERY_S)
            try:
                await self.reap()
                if time.monotonic() - self._usage_read_at >= USAGE_EVERY_S:
                    self._usage_read_at = time.monotonic()
                    await self.read_usage()
            except Exception:
                log.exception("the sandbox reaper failed; it runs again")

    # --- internals ------------------------------------------------------------------------
    def _get(self, sandbox_id: str) -> _Entry:
        entry = self._entries.get(sandbox_id)
        if entry is None:
            raise SandboxNotFound(f"no sandbox {sandbox_id} on this node")
        return entry

    def _live(self, sandbox_id: str) -> _Entry:
        entry = self._get(sandbox_id)
        if entry.status.state is SandboxState.STOPPED:
            raise SandboxNotRunning(f"sandbox {sandbox_id} has stopped ({entry.status.reason})")
        return entry

    def _touch(self, entry: _Entry) -> None:
        entry.status.last_active_at = self._clock()

    def _save(self, entry: _Entry) -> None:
        """Write what a restarted node needs to adopt the sandbox (spec, then status)."""
        base = self._state_dir / entry.spec.sandbox_id
        for path, text in (
            (base.with_suffix(".spec"), entry.spec.model_dump_json()),
            (base.with_suffix(".json"), entry.status.model_dump_json()),
        ):
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(text)
            tmp.replace(path)

    def _forget(self, sandbox_id: str) -> None:
        for suffix in (".json", ".spec"):
            (self._state_dir / f"{sandbox_id}{suffix}").unlink(missing_ok=True)
