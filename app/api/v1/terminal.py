"""``GET /v1/sandboxes/{sandbox_id}/terminal``: a sandbox's terminal over a WebSocket
(``app.sandboxes.terminal``), for the tenant whose key is in ``Authorization`` (or
``X-API-Key``) and its own sandboxes only. A connection without a tenant's valid key is
refused before it is accepted (HTTP 403)."""

from __future__ import annotations

from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket

from app.auth import credentials
from app.auth.principal import Principal
from app.errors import CorralError
from app.sandboxes import terminal
from app.services import Services

PATH = "/v1/sandboxes/{sandbox_id}/terminal"


async def api_terminal(websocket: WebSocket) -> None:
    services: Services = websocket.app.state.services
    principal: Principal | None = None
    try:
        presented = credentials.presented(websocket, credentials.API)
        if presented is not None:
            principal = await services.authenticator.tenant_for(presented)
    except CorralError:
        principal = None
    if principal is None:
        await websocket.close(1008, "a tenant's API key is required")
        return
    await terminal.serve(websocket, services, principal, websocket.path_params["sandbox_id"])


def routes() -> list[BaseRoute]:
    return [WebSocketRoute(PATH, api_terminal)]
