"""The app factory: ``create_app(settings)`` builds the gateway (and, embedded, a node).

The lifespan opens the services, then the keyless listener (``app.http.listeners``) when
one is configured, and closes them in reverse order.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware

from app.api.table import ENDPOINTS, routes
from app.http.errors import HANDLERS
from app.http.listeners import serving_keyless
from app.http.middleware import BodySizeLimit, RequestMetrics
from app.http.openapi import build
from app.http.routing import TableRouter
from app.metrics import Metrics
from app.quotas.throttles import ThrottleHeaders
from app.services import open_services
from app.settings import Settings

VERSION = "0.1.0"


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI document, built once per process: it depends only on the endpoint
    records (no setting changes it), and building it walks every schema model (most of
    an app's construction). Shared by every app of the process: read, never changed."""
    return build(ENDPOINTS, title="Corral", version=VERSION)


def create_app(settings: Settings | None = None, *, with_node: bool = True) -> Starlette:
    """The ASGI app. ``with_node`` runs a node agent in-process (``corral serve``)."""
    settings = settings or Settings()

    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with open_services(settings, metrics=metrics, with_node=with_node) as services:
            app.state.services = services
            async with serving_keyless(app, settings) as addresses:
                app.state.keyless_addresses = addresses
                yield

    app = Starlette(
        middleware=[
            Middleware(RequestMetrics, metrics=metrics),
            Middleware(ThrottleHeaders),
            Middleware(BodySizeLimit, limit=settings.max_body_bytes),
        ],
        exception_handlers=HANDLERS,
        lifespan=lifespan,
    )
    # the routes (``app.api.table``), looked up by their static paths first (``app.http.routing``)
    app.router = TableRouter(
        routes(),
        lifespan=lifespan,
    )
    app.state.openapi = openapi_document()
    app.state.settings = settings
    return app
