"""Host id ranges of user-namespaced sandboxes: allocated, freed and reconciled host-wide.

Every container sandbox runs in a user namespace of its own whose ids 0-65535 are a range
of host uids and gids that no other sandbox on the host holds: root inside is an
unprivileged host uid, and the kernel's per-user limits (pipe buffers, inotify instances
and watches, processes, keys) count per sandbox, never across tenants.

Ranges are slots of ``SIZE`` ids from ``first``. A slot is held by a file
``<registry>/<slot>`` created with ``O_EXCL`` whose content is the directory of the
sandbox holding it. The registry is host-wide (every node on the host allocates from it:
two nodes never hand out one range) and lives in ``/run`` by default, so it goes with a
reboot, as the sandboxes do. A slot whose sandbox directory is gone and whose ids no
process on the host runs as is free again: a node's start and an allocation that finds
no free slot reclaim those (a node killed between a create and its destroy leaves no
range taken for good). Allocation and reclaim hold the registry's lock, so a reclaim
never removes a slot just taken.

A slot also has the directory its sandbox's root file system is mounted in,
``<registry>/<slot>.root/rootfs``: the runtime sets up the container's root from inside
its user namespace, as the range's root, which must be able to reach the mount point.
So the registry is searchable by anyone (mode 0711, never listable) and each slot's
directory belongs to its range's root, mode 0700: no other sandbox and no other local
user of the host can enter it, and the node's data dir stays private (0700).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from node.sandboxes.base import NodeFull
from node.sandboxes.crun import mounts

log = logging.getLogger(__name__)

SIZE = 65536  #: ids per sandbox: 0-65535 inside, as a container image expects
DEFAULT_REGISTRY = Path("/run/corral/uid-ranges")
DEFAULT_FIRST = 1 << 28  #: far above any host account
DEFAULT_SLOTS = 16384  #: up to 2**28 + 2**30: every id stays below 2**31
_LOCK = ".lock"


@dataclass(frozen=True, slots=True)
class IdRange:
    slot: int
    first: int  #: the host id of id 0 inside
    size: int = SIZE

    def mapping(self) -> str:
        """The range as a ``uid_map``/``gid_map`` line: inside 0.. is host ``first``.."""
        return f"0 {self.first} {self.size}"

    def reverse(self) -> str:
        """The map that shows this range's host ids as the ids they are inside (for
        reading a sandbox's files back into the canonical ids an image stores)."""
        return f"{self.first} 0 {self.size}"

    def host(self, inner: int) -> int:
        return self.first + inner

    def holds(self, host_id: int) -> bool:
        return self.first <= host_id < self.first + self.size


class UidRanges:
    def __init__(
        self,
        registry: Path = DEFAULT_REGISTRY,
        *,
        first: int = DEFAULT_FIRST,
        slots: int = DEFAULT_SLOTS,
    ) -> None:
        if first < SIZE or first + slots * SIZE > 1 << 32:
            raise ValueError(f"uid ranges from {first} for {slots} slots do not fit in 32 bits")
        self.registry = registry
        self.first = first
        self.slots = slots

    def range(self, slot: int) -> IdRange:
        return IdRange(slot=slot, first=self.first + slot * SIZE)

    def rootfs(self, ids: IdRange) -> Path:
        """Where the sandbox holding ``ids`` has its root file system mounted."""
        return self.registry / f"{ids.slot}.root" / "rootfs"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.registry.mkdir(parents=True, exist_ok=True, mode=0o711)
        os.chmod(self.registry, 0o711)
        fd = os.open(self.registry / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def allocate(self, holder: Path) -> IdRange:
        """A free range, now held by the sandbox directory ``holder`` (which exists)."""
        with self._locked():
            slot = self._free_slot()
            if slot is None:
                self._reclaim()
                slot = self._free_slot()
            if slot is None:
                raise NodeFull(f"every one of the host's {self.slots} sandbox id ranges is held")
            fd = os.open(
                self.registry / str(slot),
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                0o600,
            )
            try:
                os.write(fd, str(holder).encode())
            finally:
                os.close(fd)
            ids = self.range(slot)
            try:
                self._make_root(ids)
            except BaseException:
                (self.registry / str(slot)).unlink(missing_ok=True)
                raise
        return ids

    def _make_root(self, ids: IdRange) -> None:
        self._remove_root(ids.slot)  # a reclaimed slot's, if it was left
        directory = self.registry / f"{ids.slot}.root"
        directory.mkdir(mode=0o700)
        os.chown(directory, ids.first, ids.first)
        (directory / "rootfs").mkdir(mode=0o755)

    def _remove_root(self, slot: int) -> None:
        directory = self.registry / f"{slot}.root"
        mounts.unmount(directory / "rootfs")
        shutil.rmtree(directory, ignore_errors=True)

    def _free_slot(self) -> int | None:
        taken = {int(name) for name in os.listdir(self.registry) if name.isdigit()}
        return next((slot for slot in range(self.slots) if slot not in taken), None)

    def release(self, holder: Path, slot: int) -> None:
        """Free ``slot`` if ``holder`` holds it (a range handed on since is left alone)."""
        with self._locked():
            if self._holder(slot) == str(holder):
                self._remove_root(slot)
                (self.registry / str(slot)).unlink(missing_ok=True)

    def held(self, holder: Path) -> IdRange | None:
        """The range ``holder`` holds, if any (a restarted node's sandbox)."""
        with self._locked():
            for name in os.listdir(self.registry):
                if name.isdigit() and self._holder(int(name)) == str(holder):
                    return self.range(int(name))
        return None

    def reclaim(self) -> int:
        """Free every slot whose sandbox directory is gone; how many were freed."""
        with self._locked():
            return self._reclaim()

    def _reclaim(self) -> int:
        stale = []
        for name in os.listdir(self.registry):
            if name.isdigit():
                holder = self._holder(int(name))
                if holder is not None and not os.path.isdir(holder):
                    stale.append(self.range(int(name)))
        running = _running_ids() if stale else set()
        freed = 0
        for ids in stale:
            if any(ids.holds(uid) for uid in running):
                log.warning(
                    "id range %d: its sandbox dir is gone but processes still run as it", ids.slot
                )
                continue
            self._remove_root(ids.slot)
            (self.registry / str(ids.slot)).unlink(missing_ok=True)
            freed += 1
        if freed:
            log.info("freed %d sandbox id ranges whose sandboxes are gone", freed)
        return freed

    def _holder(self, slot: int) -> str | None:
        try:
            return (self.registry / str(slot)).read_text()
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
            return None


def _running_ids() -> set[int]:
    """The real uids of every process on the host."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                found.add(os.stat(f"/proc/{name}").st_uid)
    return found
