"""The routes only nodes may call (``/internal/...``): the node token.

``Authorization: Bearer <node token>`` (``CORRAL_NODE_TOKEN``, the token the gateway calls
nodes with), compared in constant time. Without it: 401 ``missing_node_token``; with
another token, or on a gateway that has none: 403 ``invalid_node_token``.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from starlette.requests import Request

from app.errors import InvalidNodeToken, NodeTokenRequired

if TYPE_CHECKING:
    from app.services import Services


def authorized_node(request: Request) -> Services:
    """The app's services, once the request has shown the node token."""
    services: Services = request.app.state.services
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        raise NodeTokenRequired("Authorization: Bearer <node token> is required")
    token = services.settings.node.node_token
    expected = token.get_secret_value() if token is not None else ""
    if not expected or not hmac.compare_digest(presented.strip().encode(), expected.encode()):
        raise InvalidNodeToken()
    return services
