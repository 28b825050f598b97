"""The node's on-disk cache of compiled modules, trusted only after it is checked.

Layout: ``<root>/key`` (the node's HMAC key, 32 random bytes, 0600) and
``<root>/<engine fingerprint>/{interpreters,modules}/<sha256>.cwasm``. A ``.cwasm`` is
native code: whoever can change one runs code in every worker that loads it. So:

* **Ownership.** Every directory from ``/`` down to an entry is opened one component at
  a time without following symlinks and checked with ``fstat``: owned by root or by this
  process's user, and not writable by group or others (a root-owned sticky directory
  such as ``/tmp`` is accepted above the cache root). The cache's own directories are
  created 0700 and must be owned by this process's user, and so must the entry (a regular
  file, not group/world writable) and the key (0600). The entry is read through the
  descriptors that were checked, so nothing can be swapped in between.
* **Integrity.** Each entry starts with ``HMAC-SHA256(key, fingerprint, kind, sha256,
  content)``: an entry written by anything but this node's cache, copied from another
  node, or filed under another module's hash is refused.
* A refused entry is logged and compiled again; when the cache directories themselves
  fail the checks, nothing is read from or written to them.

Entries are written to a temporary name and renamed. Only ``modules`` (raw modules,
uploaded by callers) is bounded: its least recently used entries are deleted past
``max_bytes``. ``interpreters`` (the pinned interpreters) is never evicted, so distinct
uploads cannot push CPython out.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

Kind = Literal["interpreters", "modules"]
SUFFIX = ".cwasm"
KEY_FILE = "key"
KEY_BYTES = 32
MAC_BYTES = 32
STALE_TMP_S = 3600.0
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeCache(Exception):
    """A directory, entry or key failed the ownership or permission checks."""


def _check(info: os.stat_result, what: str, *, own: bool, sticky_ok: bool) -> None:
    euid = os.geteuid()
    owners = {euid} if own else {0, euid}
    if info.st_uid not in owners:
        raise UnsafeCache(f"{what} is owned by uid {info.st_uid}")
    sticky_root = sticky_ok and info.st_mode & stat.S_ISVTX and info.st_uid == 0
    if info.st_mode & 0o022 and not sticky_root:
        raise UnsafeCache(f"{what} is writable by group or others ({info.st_mode:o})")


@contextlib.contextmanager
def _opened_dir(path: Path, *, own_from: Path, create: bool) -> Iterator[int]:
    """A descriptor of ``path`` reached from ``/`` one checked component at a time.
    Components at or below ``own_from`` must be ours (created 0700 if ``create``)."""
    fd = os.open("/", _DIR_FLAGS)
    current = Path("/")
    try:
        _check(os.fstat(fd), "/", own=False, sticky_ok=False)
        for part in path.parts[1:]:
            current = current / part
            own = current == own_from or own_from in current.parents
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not (create and own):
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
            _check(os.fstat(fd), str(current), own=own, sticky_ok=not own)
        yield fd
    finally:
        os.close(fd)


class ModuleCache:
    def __init__(self, root: Path, fingerprint: str, *, max_bytes: int) -> None:
        # symlinks above the root are the operator's; at and below it none is followed
        self.root = Path(os.path.realpath(root))
        self.fingerprint = fingerprint
        self.max_bytes = max_bytes
        self._key: bytes | None = None
        self._lock = threading.Lock()

    def dir(self, kind: Kind) -> Path:
        return self.root / self.fingerprint / kind

    @property
    def usable(self) -> bool:
        return self._key is not None

    def open(self) -> bool:
        """Create the directories (0700) and the key, and check them; False (logged)
        when the cache cannot be trusted, and then it is not used at all."""
        try:
            # ancestors the operator did not make get the default mode; ours get 0700
            self.root.parent.mkdir(parents=True, exist_ok=True)
            for kind in ("interpreters", "modules"):
                with _opened_dir(self.dir(kind), own_from=self.root, create=True):
                    pass
            with _opened_dir(self.root, own_from=self.root, create=True) as fd:
                self._key = _read_or_make_key(fd)
        except (OSError, UnsafeCache) as exc:
            log.warning("wasm cache %s is not used: %s", self.root, exc)
            self._key = None
        return self._key is not None

    def _mac(self, kind: Kind, sha256: str, content: bytes) -> bytes:
        assert self._key is not None
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in (self.fingerprint.encode(), kind.encode(), sha256.encode()):
            mac.update(len(part).to_bytes(4, "big") + part)
        mac.update(content)
        return mac.digest()

    def load(self, kind: Kind, sha256: str, *, max_bytes: int) -> bytes | None:
        """The checked content of an entry; None when absent or refused (then deleted if
        the directory is sound)."""
        if self._key is None:
            return None
        name = f"{sha256}{SUFFIX}"
        try:
            with _opened_dir(self.dir(kind), own_from=self.root, create=False) as dfd:
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                except FileNotFoundError:
                    return None
                with os.fdopen(fd, "rb") as entry:
                    info = os.fstat(entry.fileno())
                    if not stat.S_ISREG(info.st_mode):
                        raise UnsafeCache(f"{name} is not a regular file")
                    _check(info, name, own=True, sticky_ok=False)
                    data = entry.read(max_bytes + MAC_BYTES + 1)
                mac, content = data[:MAC_BYTES], data[MAC_BYTES:]
                if len(data) > max_bytes + MAC_BYTES or not hmac.compare_digest(
                    mac, self._mac(kind, sha256, content)
                ):
                    log.warning("wasm cache: %s/%s fails its HMAC; compiling again", kind, name)
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=dfd)
                    return None
                if kind == "modules":
                    with contextlib.suppress(OSError):
                        os.utime(name, dir_fd=dfd)  # recency for LRU eviction
                return content
        except (OSError, UnsafeCache) as exc:
            log.warning("wasm cache: refusing %s/%s: %s; compiling again", kind, name, exc)
            return None

    def store(self, kind: Kind, sha256: str, content: bytes) -> None:
        """Write the entry atomically (best effort: a failure is logged), then evict."""
        if self._key is None:
            return
        name = f"{sha256}{SUFFIX}"
        tmp = f".tmp-{secrets.token_hex(8)}{SUFFIX}"
        try:
            with _opened_dir(self.dir(kind), own_from=self.root, create=True) as dfd:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
                try:
                    with os.fdopen(fd, "wb") as out:
                        out.write(self._mac(kind, sha256, content))
                        out.write(content)
                    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=dfd)
                    raise
                if kind == "modules":
                    self._evict(dfd, keep=name)
        except (OSError, UnsafeCache) as exc:
            log.warning("wasm cache: cannot store %s/%s: %s", kind, name, exc)

    def _evict(self, dfd: int, *, keep: str) -> None:
        """Delete least recently used raw-module entries until they fit ``max_bytes``."""
        with self._lock:
            entries: list[tuple[float, int, str]] = []
            with os.scandir(dfd) as it:
                for item in it:
                    try:
                        st = item.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if item.name.startswith(".tmp-"):
                        if time.time() - st.st_mtime > STALE_TMP_S:  # left by a crash
                            with contextlib.suppress(OSError):
                                os.unlink(item.name, dir_fd=dfd)
                        continue
                    entries.append((st.st_mtime, st.st_size, item.name))
            total = sum(size for _, size, _ in entries)
            for _, size, name in sorted(entries):
                if total <= self.max_bytes:
                    break
                if name == keep:
                    continue
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dfd)
                total -= size
                log.info("wasm cache: evicted %s (%d bytes)", name, size)


def _read_or_make_key(root_fd: int) -> bytes:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(KEY_FILE, flags, dir_fd=root_fd)
    except FileNotFoundError:
        tmp = f".key-{secrets.token_hex(8)}"
        create = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        wfd = os.open(tmp, create, 0o600, dir_fd=root_fd)
        with os.fdopen(wfd, "wb") as out:
            out.write(secrets.token_bytes(KEY_BYTES))
        try:
            os.link(tmp, KEY_FILE, src_dir_fd=root_fd, dst_dir_fd=root_fd, follow_symlinks=False)
        except FileExistsError:  # another process made it first
            pass
        finally:
            os.unlink(tmp, dir_fd=root_fd)
        fd = os.open(KEY_FILE, flags, dir_fd=root_fd)
    with os.fdopen(fd, "rb") as key_file:
        info = os.fstat(key_file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077:
            raise UnsafeCache(f"the cache key is not a private file ({info.st_mode:o})")
        _check(info, "the cache key", own=True, sticky_ok=False)
        key = key_file.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:
        raise UnsafeCache("the cache key has the wrong size")
    return key
