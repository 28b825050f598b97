"""The operator deletes a tenant from its page: a page of its own asks first and offers
the two choices (keep its records, or purge them: ``app.tenants.deletion``), and the
answer shows what was done and what a purge left for the next try."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from app.api.console.actions import perform
from app.api.console.render import render
from app.api.console.sessions import User
from app.api.v1 import tenants as tenant_routes
from app.errors import CorralError


async def delete_form(request: Request, user: User) -> Response:
    """The question, with a button for each choice (and Cancel)."""
    tenant_id = request.path_params["tenant_id"]
    try:
        tenant = await perform(
            tenant_routes.get_tenant, request, user, path={"tenant_id": tenant_id}
        )
    except CorralError as exc:
        return render(request, user, "error.html", {"message": exc.message}, exc.status)
    return render(request, user, "tenant_delete.html", {"tenant": tenant})


async def delete_tenant(request: Request, user: User) -> Response:
    """Delete as chosen (``purge`` yes or no); the result page."""
    tenant_id = request.path_params["tenant_id"]
    purge = (await request.form()).get("purge") == "yes"
    try:
        done = await perform(
            tenant_routes.delete_tenant,
            request,
            user,
            path={"tenant_id": tenant_id},
            query={"purge": "true" if purge else "false"},
        )
    except CorralError as exc:
        return render(request, user, "error.html", {"message": exc.message}, exc.status)
    return render(request, user, "tenant_deleted.html", {"done": done, "purge": purge})
