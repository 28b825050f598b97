"""``GET /v1/images``: the images a sandbox can be created from (the control plane's
store, shared by every tenant), and one of them by name or digest."""

from __future__ import annotations

from datetime import UTC, datetime

from app.errors import ImageNotFound
from app.http.endpoint import Call, endpoint
from app.images.catalog import TEMPLATE_IMAGES
from app.schemas.images import ImageInfo, ImageList
from images.store import Image

TAGS = ["sandboxes"]


def _info(image: Image) -> ImageInfo:
    return ImageInfo(
        name=image.name,
        digest=image.digest,
        size_bytes=image.size_bytes,
        created_at=datetime.fromtimestamp(image.created, UTC),
        source=image.source,
        user=image.user,
        workdir=image.workdir,
        packages=list(image.packages),
        templates=sorted(t for t, name in TEMPLATE_IMAGES.items() if name == image.name),
    )


@endpoint(
    "GET",
    "/v1/images",
    summary="The images sandboxes are created from",
    tags=TAGS,
    auth="tenant_or_admin",
    response=ImageList,
)
async def list_images(call: Call) -> ImageList:
    found = await call.services.images.list()
    return ImageList(images=[_info(image) for image in found])


@endpoint(
    "GET",
    "/v1/images/{ref}",
    summary="One image, by name or digest",
    tags=TAGS,
    auth="tenant_or_admin",
    response=ImageInfo,
    errors=(404,),
)
async def get_image(call: Call) -> ImageInfo:
    ref = call.path["ref"]
    image = await call.services.images.find(ref)
    if image is None:
        raise ImageNotFound(f"no image named {ref!r}")
    return _info(image)


endpoints = [list_images, get_image]
