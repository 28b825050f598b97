"""The seam every sandbox backend sits behind (crun containers today, microVMs next).

A backend makes, runs and removes sandboxes on this node; the node's
``SandboxManager`` decides when (TTL, idle timeout, reconciliation) and keeps the
statuses. Every method is keyed by sandbox id, idempotent where it can be (``destroy`` of
a sandbox that is gone succeeds), and raises a ``SandboxError`` subclass whose ``code``
the node's API answers with (the gateway maps it to its own errors):

    SandboxError              500 sandbox_error
    ├── SandboxNotFound       404 sandbox_not_found
    ├── SandboxNotRunning     409 sandbox_not_running   (paused or stopped)
    ├── SandboxUnresponsive   503 sandbox_unresponsive  (its init refused or did not answer)
    ├── NotATerminal          409 not_a_terminal        (a resize of a process without one)
    ├── SandboxPathError      400 invalid_path
    │   ├── PathNotFound      404 path_not_found
    │   ├── PathExists        409 path_exists
    │   ├── NotADirectory     400 not_a_directory
    │   └── PermissionDenied  403 permission_denied     (for the user the call acts as)
    ├── SnapshotNotFound      404 snapshot_not_found
    ├── SnapshotInUse         409 snapshot_in_use
    ├── FileTooLarge          413 file_too_large
    ├── DiskFull              507 disk_full             (the sandbox's disk or memory)
    ├── TooManyTransfers      429 too_many_transfers    (Retry-After)
    ├── ImageUnavailable      404 image_not_found
    ├── ImageFetchFailed      503 image_fetch_failed    (from the control plane)
    ├── NodeFull              503 no_capacity
    ├── BackendUnavailable    503 backend_unavailable
    └── Unsupported           501 unsupported
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from wire.sandboxes import (
    MAX_PAGE,
    EntryPage,
    ExecEvent,
    ExecRequest,
    FileEntry,
    Phases,
    PtySize,
    SandboxSpec,
    WatchEvents,
)

if TYPE_CHECKING:
    from node.settings import NodeSettings


class SandboxError(Exception):
    status: ClassVar[int] = 500
    code: ClassVar[str] = "sandbox_error"

    def headers(self) -> dict[str, str]:
        return {}


class SandboxNotFound(SandboxError):
    status, code = 404, "sandbox_not_found"


class SandboxNotRunning(SandboxError):
    status, code = 409, "sandbox_not_running"


class SandboxUnresponsive(SandboxError):
    """The sandbox's init could not start the call (its processes are at their limit) or
    did not answer in time."""

    status, code = 503, "sandbox_unresponsive"


class NotATerminal(SandboxError):
    """A terminal's call (resize) on a process that runs without one."""

    status, code = 409, "not_a_terminal"


class SandboxPathError(SandboxError):
    status, code = 400, "invalid_path"


class PathNotFound(SandboxPathError):
    status, code = 404, "path_not_found"


class PathExists(SandboxPathError):
    status, code = 409, "path_exists"


class NotADirectory(SandboxPathError):
    status, code = 400, "not_a_directory"


class PermissionDenied(SandboxPathError):
    """The user a file call acts as may not do it (the kernel said so, inside the sandbox)."""

    status, code = 403, "permission_denied"


class SnapshotNotFound(SandboxError):
    status, code = 404, "snapshot_not_found"


class SnapshotInUse(SandboxError):
    status, code = 409, "snapshot_in_use"


class NodeFull(SandboxError):
    """The node holds its most sandboxes, or its create queue is full or too slow."""

    status, code = 503, "no_capacity"


class FileTooLarge(SandboxError):
    status, code = 413, "file_too_large"


class DiskFull(SandboxError):
    """A write found the sandbox's disk (or the memory its RAM disk is charged to) full."""

    status, code = 507, "disk_full"


class TooManyTransfers(SandboxError):
    """The tenant (or the node) has its most file transfers running; retry shortly."""

    status, code = 429, "too_many_transfers"

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"}


class ImageUnavailable(SandboxError):
    status, code = 404, "image_not_found"


class ImageFetchFailed(SandboxError):
    """The node lacks the image and could not fetch it from the control plane."""

    status, code = 503, "image_fetch_failed"


class BackendUnavailable(SandboxError):
    status, code = 503, "backend_unavailable"


class Unsupported(SandboxError):
    status, code = 501, "unsupported"


class FileStream(ABC):
    """A file being read (``SandboxBackend.read_file``): its size when it was opened, then
    its bytes in bounded chunks, as they come; ``close`` releases it, read or not."""

    size: int

    @abstractmethod
    def chunks(self) -> AsyncIterator[bytes]:
        """The bytes; raises (a ``SandboxError``) when the read cannot be completed."""

    @abstractmethod
    async def close(self) -> None: ...


class DirWatch(ABC):
    """Changes to one directory of a sandbox, kept until read (``node.sandboxes.watch``)."""

    @abstractmethod
    def drain(self) -> WatchEvents:
        """The events since the last drain."""

    @abstractmethod
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RootImage:
    """The read-only base a sandbox starts from (resolved by the node's image store)."""

    digest: str
    rootfs: Path
    env: tuple[tuple[str, str], ...] = ()
    workdir: str = "/"
    #: read-only layers over the image, topmost first (a snapshot's writable layer)
    layers: tuple[Path, ...] = ()


@dataclass(frozen=True, slots=True)
class SnapshotFiles:
    """A sandbox's writable layer, copied: what a new sandbox can start from."""

    snapshot_id: str
    layer: Path
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Usage:
    memory_bytes: int | None = None
    cpu_ms: float | None = None
    disk_bytes: int | None = None
    #: every process of the sandbox is gone, its init too (killed by the OOM killer when
    #: the sandbox's memory was full): it can never run anything again
    ended: bool = False


class Process(ABC):
    """One command running in a sandbox, started by ``SandboxBackend.exec``."""

    pid: int  #: inside the sandbox

    @abstractmethod
    def events(self) -> AsyncIterator[ExecEvent]:
        """``ExecStarted``, then ``ExecOutput`` as it comes, then one ``ExecExit``. Can be
        iterated once; output beyond the request's cap is counted, not kept."""

    @abstractmethod
    async def signal(self, signum: int) -> None:
        """Send ``signum`` to the command's whole session."""

    @abstractmethod
    async def write_stdin(self, data: bytes) -> None: ...

    @abstractmethod
    async def close_stdin(self) -> None: ...

    async def resize(self, size: PtySize) -> None:
        """Set the size of the command's terminal (``ExecRequest.pty``)."""
        raise NotATerminal(f"process {self.pid} has no terminal")

    def pause_output(self) -> None:
        """Stop taking the command's output until ``resume_output``: nobody reads it, so
        the command blocks on write as on a full pipe (a backend that cannot: no-op)."""
        return None

    def resume_output(self) -> None:
        """Take the command's output again after ``pause_output``."""
        return None


class SandboxBackend(ABC):
    """How one kind of sandbox is made and used on a node."""

    name: ClassVar[str]

    @property
    def accelerator(self) -> str | None:
        """What runs the sandboxes' machines (a microVM's ``kvm`` or ``tcg``); None for a
        backend whose sandboxes share the host's kernel. Known once ``start`` returned."""
        return None

    @abstractmethod
    async def start(self) -> list[str]:
        """Prepare the backend; return the ids of sandboxes a previous node process left
        running (the manager destroys those it holds no record of)."""

    @abstractmethod
    async def close(self) -> None:
        """Release the backend (sandboxes are left to the manager)."""

    @abstractmethod
    async def create(self, spec: SandboxSpec, image: RootImage) -> Phases:
        """Make and start the sandbox; on failure nothing of it is left."""

    #: what a warm (paused) sandbox of this backend holds while it waits, MiB (the warm
    #: pool's idle capacity; bench/sandboxes.py and bench/microvm.py measure it)
    warm_memory_mb: ClassVar[float] = 1.0

    def claimable(self, warm: SandboxSpec, spec: SandboxSpec) -> bool:
        """Whether a warm sandbox made as ``warm`` can become ``spec`` (a container's
        limits, disk and env are set at the claim: any can)."""
        return True

    @abstractmethod
    async def claim(self, warm_id: str, spec: SandboxSpec) -> None:
        """Make the paused warm sandbox ``warm_id`` (created from the same image) the
        sandbox ``spec`` asks for: its id, limits, disk and env; then let it run."""

    @abstractmethod
    async def destroy(self, sandbox_id: str) -> None:
        """Kill every process of the sandbox and release its mounts, cgroups and files.
        Succeeds when the sandbox is already gone."""

    @abstractmethod
    async def pause(self, sandbox_id: str) -> None:
        """Freeze every process of the sandbox (memory kept, no CPU)."""

    @abstractmethod
    async def resume(self, sandbox_id: str) -> None: ...

    @abstractmethod
    async def exec(self, sandbox_id: str, request: ExecRequest, *, default_user: str) -> Process:
        """Start a command; it runs until it exits, its timeout, or the sandbox ends."""

    # File calls act as ``user`` (a name, a uid or "uid:gid"): inside the sandbox, with
    # that user's permissions, never following a symlink to what that user cannot reach;
    # nothing is chowned (a file a call creates is the user's, any other keeps its owner).
    @abstractmethod
    async def read_file(
        self, sandbox_id: str, path: str, *, user: str, max_bytes: int
    ) -> FileStream:
        """Open a regular file (``FileTooLarge`` past ``max_bytes``): its bytes stream."""

    @abstractmethod
    async def write_file(
        self,
        sandbox_id: str,
        path: str,
        chunks: AsyncIterable[bytes],
        *,
        user: str,
        mode: int = 0o644,
    ) -> FileEntry:
        """Create (with ``mode``) or truncate a file, parents made as needed, and write
        ``chunks`` to it as they come; the caller bounds their total."""

    @abstractmethod
    async def list_dir(
        self,
        sandbox_id: str,
        path: str,
        *,
        user: str,
        depth: int = 1,
        limit: int = MAX_PAGE,
        cursor: str | None = None,
    ) -> EntryPage:
        """One page of a directory's entries (and theirs, down to ``depth`` levels), in a
        stable order: at most ``limit`` after ``cursor`` (a page's ``next_cursor``)."""

    @abstractmethod
    async def stat(self, sandbox_id: str, path: str, *, user: str) -> FileEntry: ...

    @abstractmethod
    async def make_dir(self, sandbox_id: str, path: str, *, user: str) -> FileEntry:
        """Make a directory and its parents; ``PathExists`` if it exists already."""

    @abstractmethod
    async def remove(self, sandbox_id: str, path: str, *, user: str) -> None:
        """Remove a file or a whole directory tree."""

    @abstractmethod
    async def move(
        self, sandbox_id: str, source: str, destination: str, *, user: str
    ) -> FileEntry: ...

    @abstractmethod
    async def usage(self, sandbox_id: str) -> Usage: ...

    async def watch_dir(self, sandbox_id: str, path: str, *, user: str) -> DirWatch:
        """Watch one directory of the sandbox (not its subdirectories) that ``user`` may
        read."""
        raise Unsupported(f"the {self.name} backend cannot watch directories")

    @abstractmethod
    async def snapshot(self, sandbox_id: str, snapshot_id: str) -> SnapshotFiles:
        """Copy the sandbox's writable state while its processes are frozen (a
        container's files, not its processes; a microVM's whole machine, memory and
        processes too); the sandbox goes on as it was."""

    @abstractmethod
    def snapshot_layer(self, snapshot_id: str) -> SnapshotFiles | None:
        """A snapshot this node holds, or None."""

    @abstractmethod
    async def delete_snapshot(self, snapshot_id: str) -> None: ...


Factory = Callable[["NodeSettings"], SandboxBackend]
_BACKENDS: dict[str, Factory] = {}


def register(name: str, factory: Factory) -> None:
    """Make a backend available under ``name`` (``NodeSettings.sandbox_backends``)."""
    _BACKENDS[name] = factory


def backend_names() -> list[str]:
    return sorted(_BACKENDS)


def create_backend(name: str, settings: NodeSettings) -> SandboxBackend:
    try:
        factory = _BACKENDS[name]
    except KeyError:
        known = ", ".join(backend_names())
        raise BackendUnavailable(f"no sandbox backend named {name!r} (known: {known})") from None
    return factory(settings)
