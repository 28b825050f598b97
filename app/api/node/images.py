"""The images the control plane serves to nodes, by digest (``wire.images``).

    GET /internal/images/{digest}          -> ImageManifest
    GET /internal/images/{digest}/rootfs   -> the root filesystem as a tar stream

Nodes only (``app.api.node.token``). Not part of the public API document.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from app.api.node.token import authorized_node
from images.export import manifest, tar_stream
from wire.images import DIGEST_HEADER, IMAGE_PATH, ROOTFS_PATH, TAR_MEDIA_TYPE

log = logging.getLogger(__name__)


async def image_manifest(request: Request) -> Response:
    services = authorized_node(request)
    image = await services.images.get(request.path_params["digest"])
    return Response(manifest(image).model_dump_json(), media_type="application/json")


async def image_rootfs(request: Request) -> Response:
    services = authorized_node(request)
    image = await services.images.get(request.path_params["digest"])
    log.info("image %s: sending its root filesystem to %s", image.digest, request.client)
    return StreamingResponse(
        tar_stream(image), media_type=TAR_MEDIA_TYPE, headers={DIGEST_HEADER: image.digest}
    )


def routes() -> list[Route]:
    return [
        Route(IMAGE_PATH, image_manifest, methods=["GET"]),
        Route(ROOTFS_PATH, image_rootfs, methods=["GET"]),
    ]
