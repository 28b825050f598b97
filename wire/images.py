"""How a node fetches an image it lacks from the control plane, by digest.

Both requests carry ``Authorization: Bearer <node token>`` (the token gateways and nodes
share). Digests are always the full ``sha256:<64 hex>``; an image is immutable, so the
two requests need no coordination (an image removed in between is a 404 on the second).

    GET IMAGE_PATH   -> ImageManifest (JSON): what the image's ``image.json`` says
    GET ROOTFS_PATH  -> application/x-tar: the root filesystem, its root as ``./``, numeric
                        owners, modes, symlinks, hard links and device nodes as stored;
                        the digest in the ``DIGEST_HEADER`` header

The tar is the rootfs tar that ``corral images import`` accepts; the node unpacks it with
the importer's safe extraction and recomputes the digest before it keeps it.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

IMAGE_PATH = "/internal/images/{digest}"
ROOTFS_PATH = "/internal/images/{digest}/rootfs"
DIGEST_HEADER = "X-Corral-Image-Digest"
TAR_MEDIA_TYPE = "application/x-tar"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class ImageManifest(BaseModel):
    """An image's metadata as the control plane's store records it."""

    digest: str = Field(pattern=DIGEST.pattern)
    name: str = Field("", description="the name it was first added under, for the record")
    size_bytes: int = Field(ge=0)
    created: float
    source: str = ""
    packages: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    user: str = "root"
    workdir: str = "/"
    parent: str | None = None
    cmd: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None
