"""A console action is an API call: the endpoint's own model validates the form's values,
its own handler does the work, as the signed-in user, and the same authorisation applies
(an admin endpoint needs the operator, a tenant endpoint a tenant)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from app.api.console.sessions import User
from app.auth.principal import Admin
from app.errors import AdminRequired, Forbidden
from app.http.endpoint import Call, Endpoint, validate

#: no body given (``None`` is a body: the JSON ``null`` a function may take as input)
NO_BODY: Any = object()


class TenantRequired(Forbidden):
    code, default_message = "tenant_required", "sign in with a tenant's key for this"


async def perform(
    endpoint: Endpoint,
    request: Request,
    user: User,
    *,
    path: dict[str, str] | None = None,
    body: Any = NO_BODY,
    query: dict[str, str] | None = None,
    raw: bool = False,
) -> Any:
    """Run ``endpoint``'s handler as ``user`` with ``path`` and ``body`` (any JSON value
    for a root-model body: a function's input); its result as JSON values (``raw``: as
    the handler returned it, a streamed file's answer). Raises the API's errors
    (``CorralError``), which the page shows. The request's body is the handler's to read
    (an upload streams through)."""
    if endpoint.auth == "admin" and not user.is_admin:
        raise AdminRequired()
    if endpoint.auth in ("tenant", "tenant_or_default") and isinstance(user.principal, Admin):
        raise TenantRequired()
    scope = {
        **request.scope,
        "path_params": dict(path or {}),
        "query_string": urlencode(query or {}).encode(),
    }
    call = Call(request=Request(scope, request.receive), principal=user.principal)
    if endpoint.query is not None:
        call.query = validate(endpoint.query, dict(query or {}), where="query")
    if endpoint.body is not None:
        call.body = validate(endpoint.body, {} if body is NO_BODY else body, where="body")
    result = await endpoint.handler(call)
    if raw:
        return result
    if isinstance(result, BaseModel):
        return result.model_dump(mode="json")
    if isinstance(result, Response):  # an endpoint that sets its own status (201, 202)
        return json.loads(bytes(result.body)) if result.body else None
    return result
