"""The control plane's image store (``Settings.resolved_images_dir``), read-only here.

``corral images build|import`` on the gateway's host fills it; the gateway only reads
it: a create's image name becomes the digest the node is sent (``digest_of``), and a
node lacking that digest fetches it from here (``app.api.node.images``). By default it is
the embedded node's store, so ``corral serve`` never copies an image.

A store that cannot be opened (an unwritable directory) leaves the gateway without one:
every create then sends the name as given, and nodes resolve it themselves.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from app.errors import ImageNotFound
from images.errors import ImageError
from images.errors import ImageNotFound as StoreImageNotFound
from images.store import Image, ImageStore
from wire.images import DIGEST

log = logging.getLogger(__name__)

#: E2B's stock templates, as Corral images (a create through the E2B API names a template;
#: any other name is an image name)
TEMPLATE_IMAGES = {"base": "python", "code-interpreter-v1": "data", "code-interpreter": "data"}


class ControlImages:
    def __init__(self, images_dir: Path) -> None:
        self.store: ImageStore | None
        try:
            self.store = ImageStore(images_dir)
        except (OSError, ImageError) as exc:
            log.warning("no image store at %s (%s): nodes resolve image names", images_dir, exc)
            self.store = None

    async def digest_of(self, ref: str) -> str | None:
        """The digest of the image ``ref`` (a name, a digest or a prefix of one) in this
        store; ``None`` when the store lacks it (or there is no store), and the node is
        to resolve ``ref`` itself."""
        if self.store is None:
            return None
        try:
            image = await asyncio.to_thread(self.store.resolve, ref)
        except StoreImageNotFound:
            return None
        except ImageError as exc:
            log.warning("image %r: the control plane's store cannot resolve it: %s", ref, exc)
            return None
        return image.digest

    async def list(self) -> list[Image]:
        """Every image in this store (none without a store)."""
        if self.store is None:
            return []
        try:
            return await asyncio.to_thread(self.store.list)
        except ImageError as exc:
            log.warning("the control plane's image store cannot be listed: %s", exc)
            return []

    async def find(self, ref: str) -> Image | None:
        """The image ``ref`` names (a name, a digest or a prefix of one), or None."""
        if self.store is None:
            return None
        try:
            return await asyncio.to_thread(self.store.resolve, ref)
        except StoreImageNotFound:
            return None
        except ImageError as exc:
            log.warning("image %r: the control plane's store cannot resolve it: %s", ref, exc)
            return None

    async def get(self, digest: str) -> Image:
        """The image of the full digest ``digest``, to serve to a node."""
        if self.store is None or not DIGEST.fullmatch(digest):
            raise ImageNotFound(f"no image {digest} on the control plane")
        try:
            return await asyncio.to_thread(self.store.resolve, digest)
        except StoreImageNotFound:
            raise ImageNotFound(f"no image {digest} on the control plane") from None
