"""Images: the immutable root filesystems stateful sandboxes start from.

Modules, one concept each:

* ``store``        ``ImageStore``: images on disk by digest, names, atomic add, remove
* ``fetch``        ``ImageFetcher``: a digest the node lacks, from the control plane
* ``digest``       the deterministic digest (and size) of a tree
* ``recipes``      ``Recipe`` and the built-in ones (``python``)
* ``debootstrap``  building a recipe from Debian's packages
* ``importer``     importing an OCI archive, a ``docker save`` tarball or a rootfs tar
* ``safetar``      unpacking a rootfs tar with no member escaping the tree
* ``dockerfile``   building the common Dockerfile instructions on a local image
* ``instructions`` reading a Dockerfile; ``context``: COPY from the build context
* ``chroot``       running a command in a tree being built (private mount namespace)
* ``mirror``       the Debian mirror of this machine's apt sources
* ``tools``, ``progress``, ``fsutil``: running build tools, progress lines, safe trees
* ``errors``       ``ImageError`` and its subclasses

The data plane's own: nothing here imports the control plane. See docs/images.md.
"""

from __future__ import annotations

from images.errors import ImageBuildError, ImageError, ImageFetchError, ImageNotFound
from images.progress import Progress
from images.recipes import RECIPES, Recipe
from images.store import Image, ImageMeta, ImageStore

__all__ = [
    "RECIPES",
    "Image",
    "ImageBuildError",
    "ImageError",
    "ImageFetchError",
    "ImageMeta",
    "ImageNotFound",
    "ImageStore",
    "Progress",
    "Recipe",
]
