"""Function artifacts for nodes, by digest (``wire.execution.ARTIFACT_PATH``).

    GET /internal/artifacts/{tenant_id}/{digest}  -> the artifact's bytes

A tool function's Job names its artifact by SHA-256 (``RunSpec.artifact``); a node that
lacks it fetches it here once (``node.artifacts``) and checks the bytes against
the digest. Nodes only (``app.api.node.token``); the artifact is looked up under the
tenant the path names, as the Job that named it was. Not part of the public API document.
"""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.api.node.token import authorized_node
from app.errors import ArtifactNotFound
from wire.execution import ARTIFACT_PATH

_DIGEST = re.compile(r"^[0-9a-f]{64}$")


async def artifact(request: Request) -> Response:
    services = authorized_node(request)
    tenant_id, digest = request.path_params["tenant_id"], request.path_params["digest"]
    if not _DIGEST.match(digest):
        raise ArtifactNotFound(f"no artifact {digest!r}")
    data = await services.read_artifact(tenant_id, digest)  # or 404 artifact_not_found
    return Response(data, media_type="application/wasm")


def routes() -> list[Route]:
    return [Route(ARTIFACT_PATH, artifact, methods=["GET"])]
