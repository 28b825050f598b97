"""The gateway's one route table: every surface's routes, in the order a request is
matched (``app.http.routing.TableRouter`` keeps that order's answers).

Each surface has its room under ``app.api``:

* ``v1``       Corral's own API (``/v1/...``, SandboxFusion's ``/run_code``, ``/healthz``):
               ``ENDPOINTS``, the only routes in the OpenAPI document; and a sandbox's
               terminal, a WebSocket (``v1.terminal``)
* ``e2b``      the E2B control plane, envd and the code interpreter, for the E2B SDKs
* ``node``     what nodes fetch from the gateway (``/internal/...``, with the node token)
* ``console``  the web console (server-rendered pages, a session cookie)
"""

from __future__ import annotations

from starlette.routing import BaseRoute

from app.api import e2b
from app.api.console import routes as console
from app.api.node import artifacts, images
from app.api.v1 import ENDPOINTS, terminal

__all__ = ["ENDPOINTS", "routes"]


def routes() -> list[BaseRoute]:
    """Every route the gateway serves, the API's first."""
    return [
        *(ep.route() for ep in ENDPOINTS),
        *terminal.routes(),
        *e2b.routes(),
        *images.routes(),
        *artifacts.routes(),
        *console.routes(),
    ]
