"""The routes only nodes may call (``/internal/...``): the node token.

``Authorization: Bearer <node token>`` (``CORRAL_NODE_TOKEN``, the token the gateway calls
nodes with; read by ``app.auth.credentials``), compared in constant time. Without it:
401 ``missing_node_token``; with another token, or on a gateway that has none: 403
``invalid_node_token``.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from starlette.requests import Request

from app.auth import credentials
from app.errors import InvalidApiKey, InvalidNodeToken, NodeTokenRequired

if TYPE_CHECKING:
    from app.services import Services


def authorized_node(request: Request) -> Services:
    """The app's services, once the request has shown the node token."""
    services: Services = request.app.state.services
    try:
        presented = credentials.presented(request, credentials.NODE)
    except InvalidApiKey:
        presented = None
    if presented is None:
        raise NodeTokenRequired("Authorization: Bearer <node token> is required")
    token = services.settings.node.node_token
    expected = token.get_secret_value() if token is not None else ""
    if not expected or not hmac.compare_digest(presented.encode(), expected.encode()):
        raise InvalidNodeToken()
    return services
