"""The images the control plane serves to nodes, by digest (``wire.images``).

    GET /internal/images/{digest}          -> ImageManifest
    GET /internal/images/{digest}/rootfs   -> the root filesystem as a tar stream

Nodes only: ``Authorization: Bearer <node token>`` (``CORRAL_NODE_TOKEN``, the token the
gateway calls nodes with), compared in constant time. Without it: 401
``missing_node_token``; with another token, or on a gateway that has none: 403
``invalid_node_token``. Not part of the public API document.
"""

from __future__ import annotations

import hmac
import logging
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from app.errors import InvalidNodeToken, NodeTokenRequired
from runtimes.images.export import manifest, tar_stream
from wire.images import DIGEST_HEADER, IMAGE_PATH, ROOTFS_PATH, TAR_MEDIA_TYPE

if TYPE_CHECKING:
    from app.services import Services

log = logging.getLogger(__name__)


def _authorized(request: Request) -> Services:
    services: Services = request.app.state.services
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        raise NodeTokenRequired("Authorization: Bearer <node token> is required")
    token = services.settings.node.node_token
    expected = token.get_secret_value() if token is not None else ""
    if not expected or not hmac.compare_digest(presented.strip().encode(), expected.encode()):
        raise InvalidNodeToken()
    return services


async def image_manifest(request: Request) -> Response:
    services = _authorized(request)
    image = await services.images.get(request.path_params["digest"])
    return Response(manifest(image).model_dump_json(), media_type="application/json")


async def image_rootfs(request: Request) -> Response:
    services = _authorized(request)
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
