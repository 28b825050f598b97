"""HTTP endpoints, one module per resource. ``ENDPOINTS`` is the whole API."""

from __future__ import annotations

from app.api.v1 import (
    admin,
    functions,
    health,
    images,
    invocations,
    keys,
    run,
    runtimes,
    sandboxes,
    sandboxfusion,
    tenants,
    usage,
)
from app.http.endpoint import Endpoint

ENDPOINTS: list[Endpoint] = [
    *health.endpoints,
    *tenants.endpoints,
    *keys.endpoints,
    *run.endpoints,
    *invocations.endpoints,
    *runtimes.endpoints,
    *sandboxfusion.endpoints,
    *functions.endpoints,
    *sandboxes.endpoints,
    *images.endpoints,
    *usage.endpoints,
    *admin.endpoints,
]
