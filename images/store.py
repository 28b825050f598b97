"""Images on disk: an immutable root filesystem and its metadata, named and digested.

Layout under ``root``::

    <hex>/rootfs/          the root filesystem; never modified once added
    <hex>/image.json       name, digest, size, created, source, packages, env, user, ...
    names/<name>           {"digest": "sha256:<hex>"}, written atomically (tmp + rename)
    .staging/<random>/     builds in progress; a crash's leftovers (older than an hour)
                           are removed when a store is next opened

An image's directory is named by the hex of its digest ``sha256:<hex>`` (no colon in the
path: overlayfs's ``lowerdir=`` uses ``:`` as its separator). An image becomes visible
in one ``rename`` of a complete staging directory, so a half-made image never is; a name
is written only after the image it points to is in place. The same tree always gives
the same digest (``digest.py``), and adding a tree whose digest exists reuses it.
``add_verified`` adds a tree that must be a given digest (one fetched from the control
plane), recomputed and refused if it is not, and writes no name.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from images.digest import TreeSummary, summarize
from images.errors import ImageBuildError, ImageError, ImageNotFound
from images.fsutil import copy_tree, remove_tree

log = logging.getLogger(__name__)

Source = Literal["debootstrap", "import", "dockerfile", "fetched"]

NAMES_DIR = "names"
STAGING_DIR = ".staging"
META_FILE = "image.json"
ROOTFS_DIR = "rootfs"
STALE_STAGING_S = 3600.0
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_HEX = re.compile(r"[0-9a-f]{64}")
_DIGEST_PREFIX = "sha256:"
_MIN_SHORT_DIGEST = 4


@dataclass(frozen=True)
class ImageMeta:
    """What a builder says about the tree it hands to ``ImageStore.add``."""

    name: str
    source: Source
    packages: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    user: str = "root"
    workdir: str = "/"
    parent: str | None = None  # the parent image's digest
    cmd: tuple[str, ...] | None = None  # recorded, not used by Corral
    entrypoint: tuple[str, ...] | None = None  # recorded, not used by Corral


@dataclass(frozen=True)
class Image:
    """An image in the store. ``rootfs`` must be treated as read-only."""

    name: str  # the name it was resolved by (or first added under); "" if unnamed
    digest: str  # "sha256:<hex>"
    rootfs: Path
    size_bytes: int
    env: dict[str, str]
    user: str
    workdir: str
    created: float  # Unix time it was first added
    source: str = ""
    parent: str | None = None
    packages: tuple[str, ...] = ()
    cmd: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None

    @property
    def short_digest(self) -> str:
        return self.digest.removeprefix(_DIGEST_PREFIX)[:12]


def check_name(name: str) -> str:
    """``name`` if it is a valid image name, else ``ImageError``."""
    if not _NAME.fullmatch(name) or name.startswith(_DIGEST_PREFIX):
        raise ImageError(
            f"invalid image name {name!r}: use letters, digits, '.', '_', '-', ':' "
            "(at most 128, not starting with 'sha256:')"
        )
    return name


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{secrets.token_hex(4)}")
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


class ImageStore:
    """The images of one node (or a shared cache), under ``root``."""

    def __init__(self, root: Path, *, stale_after_s: float = STALE_STAGING_S) -> None:
        self.root = root
        self._names = root / NAMES_DIR
        self._staging = root / STAGING_DIR
        for directory in (root, self._names, self._staging):
            directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.sweep(older_than_s=stale_after_s)

    # --- reading --------------------------------------------------------------------------
    def resolve(self, ref: str) -> Image:
        """The image named ``ref``, or with digest ``ref`` ("sha256:<hex>", or a unique
        prefix of at least 4 hex digits)."""
        if ref.startswith(_DIGEST_PREFIX):
            return self._load(self._digest_hex(ref), name=None)
        try:
            check_name(ref)
        except ImageError:
            raise ImageNotFound(f"no image {ref!r} (not a valid name or digest)") from None
        hex_ = self._name_hex(ref)
        if hex_ is None:
            raise ImageNotFound(f"no image named {ref!r}")
        return self._load(hex_, name=ref)

    def list(self) -> builtins.list[Image]:
        """Every named image (one entry per name), then unnamed ones, by name."""
        found: builtins.list[Image] = []
        named: set[str] = set()
        for name in sorted(self.names()):
            hex_ = self._name_hex(name)
            if hex_ is None:
                continue
            with contextlib.suppress(ImageNotFound):
                found.append(self._load(hex_, name=name))
                named.add(hex_)
        for hex_ in sorted(self._digest_dirs()):
            if hex_ not in named:
                with contextlib.suppress(ImageNotFound):
                    found.append(self._load(hex_, name=""))
        return found

    def names(self) -> builtins.list[str]:
        return [p.name for p in self._names.iterdir() if not p.name.startswith(".")]

    # --- writing --------------------------------------------------------------------------
    @contextlib.contextmanager
    def staging(self) -> Iterator[Path]:
        """An empty ``rootfs`` directory to build a tree in, inside this store (so
        ``add`` moves it into place with a rename); removed on the way out unless
        ``add`` took it."""
        box = self._staging / secrets.token_hex(8)
        box.mkdir(mode=0o755)
        rootfs = box / ROOTFS_DIR
        rootfs.mkdir(mode=0o755)
        try:
            yield rootfs
        finally:
            remove_tree(box)

    def add(self, staging_dir: Path, meta: ImageMeta) -> Image:
        """Record the tree at ``staging_dir`` as an image named ``meta.name``.

        ``staging_dir`` is best a directory from ``staging()``: it is then moved, not
        copied. Any other tree is copied first (``cp -a --reflink=auto``).
        """
        check_name(meta.name)
        if not self._is_staging(staging_dir):
            with self.staging() as rootfs:
                rootfs.rmdir()
                copy_tree(staging_dir, rootfs)
                return self.add(rootfs, meta)
        summary = summarize(staging_dir)
        hex_ = self._commit(staging_dir, meta, summary, created=time.time())
        self._write_name(meta.name, summary.digest)
        return self._load(hex_, name=meta.name)

    def add_verified(
        self, staging_dir: Path, meta: ImageMeta, *, digest: str, created: float
    ) -> Image:
        """Record the tree at ``staging_dir`` (from ``staging()``) as the image
        ``digest``, which its recomputed digest must be: a tree whose digest differs is
        refused (``ImageBuildError``) and left to ``staging()`` to remove. No name is
        written: ``meta.name`` is only recorded in ``image.json`` as the name the image
        was first added under (an image fetched from the control plane)."""
        if not self._is_staging(staging_dir):
            raise ImageBuildError(f"{staging_dir} is not a staging directory of this store")
        summary = summarize(staging_dir)
        if summary.digest != digest:
            raise ImageBuildError(
                f"refused: the tree's digest is {summary.digest}, not the {digest} asked for"
            )
        hex_ = self._commit(staging_dir, meta, summary, created=created)
        return self._load(hex_, name=None)

    def _is_staging(self, staging_dir: Path) -> bool:
        box = staging_dir.parent
        return box.parent.resolve() == self._staging.resolve() and staging_dir.name == ROOTFS_DIR

    def _commit(
        self, staging_dir: Path, meta: ImageMeta, summary: TreeSummary, *, created: float
    ) -> str:
        """Write ``image.json`` beside the staged tree and move its box into place in one
        rename (or reuse an image of that digest); the digest's hex."""
        box = staging_dir.parent
        hex_ = summary.digest.removeprefix(_DIGEST_PREFIX)
        record: dict[str, Any] = {
            "name": meta.name,
            "digest": summary.digest,
            "size_bytes": summary.size_bytes,
            "entries": summary.entries,
            "created": created,
            "source": meta.source,
            "packages": builtins.list(meta.packages),
            "env": dict(meta.env),
            "user": meta.user,
            "workdir": meta.workdir,
            "parent": meta.parent,
            "cmd": builtins.list(meta.cmd) if meta.cmd is not None else None,
            "entrypoint": builtins.list(meta.entrypoint) if meta.entrypoint is not None else None,
        }
        _write_json_atomic(box / META_FILE, record)
        final = self.root / hex_
        try:
            os.rename(box, final)
            log.info("added image %s (%s, %d bytes)", meta.name, summary.digest, summary.size_bytes)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not (final / META_FILE).exists():
                raise ImageBuildError(f"cannot move the image into {final}: {exc}") from exc
            log.info("image %s: digest %s exists, reused", meta.name, summary.digest)
            remove_tree(box)
        return hex_

    def tag(self, name: str, ref: str) -> Image:
        """Point ``name`` at the image ``ref`` names."""
        image = self.resolve(ref)
        self._write_name(check_name(name), image.digest)
        return self._load(self._digest_hex(image.digest), name=name)

    def remove(self, ref: str) -> None:
        """Remove a name, or (given a digest) an image and every name of it. An image left
        without a name by removing its last name is deleted too."""
        if ref.startswith(_DIGEST_PREFIX):
            hex_ = self._digest_hex(ref)
            for name in self.names():
                if self._name_hex(name) == hex_:
                    (self._names / name).unlink(missing_ok=True)
        else:
            hex_ = self.resolve(ref).digest.removeprefix(_DIGEST_PREFIX)
            (self._names / ref).unlink(missing_ok=True)
            if any(self._name_hex(n) == hex_ for n in self.names()):
                return
        # Out of sight in one rename, then deleted.
        trash = self._staging / f"rm-{secrets.token_hex(8)}"
        try:
            os.rename(self.root / hex_, trash)
        except FileNotFoundError:
            return
        remove_tree(trash)
        log.info("removed image sha256:%s", hex_)

    def sweep(self, *, older_than_s: float = STALE_STAGING_S) -> builtins.list[Path]:
        """Remove staging leftovers (a crashed build's) and stray temp files older than
        ``older_than_s``; returns what was removed."""
        cutoff = time.time() - older_than_s
        removed: builtins.list[Path] = []
        candidates = builtins.list(self._staging.iterdir()) + [
            p for p in self._names.iterdir() if p.name.startswith(".tmp-")
        ]
        for path in candidates:
            try:
                if path.lstat().st_mtime > cutoff:
                    continue
                remove_tree(path)
            except FileNotFoundError:
                continue
            except (OSError, ImageError) as exc:
                log.warning("cannot remove staging leftover %s: %s", path, exc)
                continue
            log.info("removed staging leftover %s", path)
            removed.append(path)
        return removed

    # --- internals ------------------------------------------------------------------------
    def _digest_dirs(self) -> builtins.list[str]:
        return [p.name for p in self.root.iterdir() if _HEX.fullmatch(p.name)]

    def _digest_hex(self, digest: str) -> str:
        hex_ = digest.removeprefix(_DIGEST_PREFIX).lower()
        if _HEX.fullmatch(hex_):
            return hex_
        if len(hex_) >= _MIN_SHORT_DIGEST and re.fullmatch(r"[0-9a-f]+", hex_):
            matches = [h for h in self._digest_dirs() if h.startswith(hex_)]
            if len(matches) == 1:
                return matches[0]
            if matches:
                raise ImageNotFound(f"digest {digest!r} is ambiguous ({len(matches)} images)")
        raise ImageNotFound(f"no image with digest {digest!r}")

    def _name_hex(self, name: str) -> str | None:
        try:
            data = json.loads((self._names / name).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ImageError(f"unreadable name file {self._names / name}: {exc}") from exc
        digest = data.get("digest", "") if isinstance(data, dict) else ""
        hex_ = str(digest).removeprefix(_DIGEST_PREFIX)
        return hex_ if _HEX.fullmatch(hex_) else None

    def _write_name(self, name: str, digest: str) -> None:
        _write_json_atomic(self._names / name, {"digest": digest})

    def _load(self, hex_: str, *, name: str | None) -> Image:
        directory = self.root / hex_
        try:
            data = json.loads((directory / META_FILE).read_text())
        except FileNotFoundError:
            raise ImageNotFound(f"no image with digest sha256:{hex_}") from None
        except (OSError, ValueError) as exc:
            raise ImageError(f"unreadable {directory / META_FILE}: {exc}") from exc
        cmd, entrypoint = data.get("cmd"), data.get("entrypoint")
        return Image(
            name=data.get("name", "") if name is None else name,
            digest=data["digest"],
            rootfs=directory / ROOTFS_DIR,
            size_bytes=int(data["size_bytes"]),
            env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
            user=str(data.get("user") or "root"),
            workdir=str(data.get("workdir") or "/"),
            created=float(data["created"]),
            source=str(data.get("source", "")),
            parent=data.get("parent"),
            packages=tuple(data.get("packages") or ()),
            cmd=tuple(cmd) if cmd is not None else None,
            entrypoint=tuple(entrypoint) if entrypoint is not None else None,
        )
