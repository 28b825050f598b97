"""Fetching an image a node lacks from the control plane, by digest (``wire.images``).

``ImageFetcher.resolve(ref)`` is the node's image lookup: the local store first; a full
digest (``sha256:<64 hex>``) it does not hold is fetched from the control plane's URLs,
tried in order. A name is never fetched (the gateway sends a digest whenever its own
store knows the name; a name it sends is one only the node may know).

A fetch downloads the manifest, then the root filesystem tar into a staging box of the
node's store, unpacks it with the importer's safe extraction (``safetar``: no member
escapes the tree), removes the tar and adds the tree with ``ImageStore.add_verified``,
which recomputes the digest: a tree that is not the digest asked for is refused. The
staging box is removed however the fetch ends, so a failed or interrupted fetch leaves
nothing; a crash mid-fetch leaves a staging box that the next store opened on the
directory sweeps (``ImageStore.sweep``). Concurrent resolves of one missing digest
fetch it once: a lock per digest, the store checked again under it (the node's sandbox
manager also shares one resolve among the creates that want one image at once, so the
creates waiting for a fetch hold no threads).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import httpx
from pydantic import ValidationError

from images import safetar
from images.errors import ImageError, ImageFetchError, ImageNotFound
from images.store import Image, ImageMeta, ImageStore
from wire.images import DIGEST, DIGEST_HEADER, IMAGE_PATH, ROOTFS_PATH, ImageManifest

log = logging.getLogger(__name__)

TIMEOUT = httpx.Timeout(60.0, connect=5.0)  #: per read: a large image streams for longer
_CHUNK = 1 << 20
DOWNLOAD = "download.tar"
#: what a fetched image keeps of the control plane's manifest (its source is "fetched")
_META_FIELDS = {"name", "packages", "env", "user", "workdir", "parent", "cmd", "entrypoint"}


class ImageFetcher:
    """The node's images: its store, and the control plane's for digests it lacks."""

    def __init__(
        self,
        store: ImageStore,
        urls: list[str],
        token: str,
    ) -> None:
        self.store = store
        self._urls = [url.rstrip("/") for url in urls]
        self._headers = {"authorization": f"Bearer {token}"}
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def resolve(self, ref: str) -> Image:
        """The image ``ref`` (a name, or a digest or its prefix) from the store, fetching
        a full digest the store lacks."""
        try:
            return self.store.resolve(ref)
        except ImageNotFound:
            if not DIGEST.fullmatch(ref) or not self._urls:
                raise
        with self._lock(ref):
            try:  # fetched meanwhile by the resolve that held the lock
                return self.store.resolve(ref)
            except ImageNotFound:
                return self.fetch(ref)

    def _lock(self, digest: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(digest, threading.Lock())

    def fetch(self, digest: str) -> Image:
        """Fetch ``digest`` from the first control plane that has it."""
        missing: list[str] = []
        failed: list[str] = []
        for url in self._urls:
            try:
                return self._fetch_from(url, digest)
            except ImageNotFound as exc:
                missing.append(str(exc))
            except ImageError as exc:
                log.warning("image %s: fetch from %s failed: %s", digest, url, exc)
                failed.append(str(exc))
        if failed:
            raise ImageFetchError(f"cannot fetch image {digest}: " + "; ".join(failed))
        raise ImageNotFound(f"no image {digest} here or on the control plane ({missing[0]})")

    def _fetch_from(self, url: str, digest: str) -> Image:
        with httpx.Client(base_url=url, headers=self._headers, timeout=TIMEOUT) as client:
            manifest = self._manifest(client, url, digest)
            with self.store.staging() as rootfs:
                archive = rootfs.parent / DOWNLOAD
                try:
                    size = self._download(client, url, digest, archive)
                    safetar.unpack(archive, rootfs)
                finally:
                    archive.unlink(missing_ok=True)
                kept = manifest.model_dump(include=_META_FIELDS)
                meta = ImageMeta(**kept, source="fetched")
                image = self.store.add_verified(
                    rootfs, meta, digest=digest, created=manifest.created
                )
        log.info("image %s: fetched from %s (%d bytes of tar)", digest, url, size)
        return image

    def _manifest(self, client: httpx.Client, url: str, digest: str) -> ImageManifest:
        response = self._get(client, url, IMAGE_PATH.format(digest=digest))
        try:
            manifest = ImageManifest.model_validate_json(response.content)
        except ValidationError as exc:
            raise ImageFetchError(f"{url}: an invalid manifest for {digest}: {exc}") from exc
        if manifest.digest != digest:
            raise ImageFetchError(f"{url}: the manifest of {digest} names {manifest.digest}")
        return manifest

    def _download(self, client: httpx.Client, url: str, digest: str, archive: Path) -> int:
        path = ROOTFS_PATH.format(digest=digest)
        size = 0
        try:
            with client.stream("GET", path) as response:
                _check(response, url, path)
                if response.headers.get(DIGEST_HEADER) != digest:
                    raise ImageFetchError(
                        f"{url}: the tar of {digest} says it is "
                        f"{response.headers.get(DIGEST_HEADER)!r}"
                    )
                with open(archive, "wb") as out:
                    for chunk in response.iter_bytes(_CHUNK):
                        out.write(chunk)
                        size += len(chunk)
        except httpx.HTTPError as exc:
            raise ImageFetchError(f"{url}: downloading {digest} failed: {exc!r}") from exc
        return size

    def _get(self, client: httpx.Client, url: str, path: str) -> httpx.Response:
        try:
            response = client.get(path)
        except httpx.HTTPError as exc:
            raise ImageFetchError(f"{url} cannot be reached: {exc!r}") from exc
        _check(response, url, path)
        return response


def _check(response: httpx.Response, url: str, path: str) -> None:
    if response.status_code == 404:
        raise ImageNotFound(f"{url}{path}: 404")
    if response.status_code != 200:
        response.read()
        raise ImageFetchError(f"{url}{path}: {response.status_code} {response.text[:200]}")
