"""The console's function pages: a tenant lists its functions, registers one or a new
version (source text, or a ``.wasm`` module uploaded from the page), opens one to read
its versions and aliases, and invokes a version with a JSON input, each through the
function API's own endpoint; the operator reads every tenant's, read-only."""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import quote

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from app.api.console import lists, names
from app.api.console.actions import perform
from app.api.console.pages import pages
from app.api.console.render import render, services_of
from app.api.console.sessions import User
from app.api.v1 import functions as api
from app.api.v1.functions import function_out, version_out
from app.db import functions as repo
from app.errors import CorralError, NotFound

PAGE = 50
#: the languages a function can be written in (``FunctionManifest.language``)
LANGUAGES = ("python", "nodejs", "wasm-python", "wasm-javascript", "wasm")
#: what the register form keeps when it is shown again after a refusal
FORM_FIELDS = ("name", "language", "entry_point", "code", "input_schema", "timeout_s", "memory_mb")


FILTERS = ("name", "language")


async def list_page(request: Request, user: User, **context: Any) -> Response:
    """The user's live functions (the operator: everyone's), filtered and sorted
    (``app.api.console.lists``)."""
    q = request.query_params
    filters = {k: q.get(k, "") for k in FILTERS}
    if user.is_admin:
        filters["tenant"] = q.get("tenant", "")
    error = context.pop("error", None)
    async with services_of(request).sessions() as session:
        listed, refused = await lists.safely(
            "functions",
            session,
            tenant_id=user.tenant_id,
            filters=filters,
            sort=q.get("sort"),
            cursor=q.get("cursor"),
        )
        error = refused or error
        tenant_names = await names.tenants(session, (fn.tenant_id for fn in listed.rows))
    functions = [
        {
            **function_out(fn).model_dump(mode="json"),
            "tenant_id": fn.tenant_id,
            "tenant_name": tenant_names.get(fn.tenant_id, ""),
        }
        for fn in listed.rows
    ]
    return render(
        request,
        user,
        "functions.html",
        {
            "functions": functions,
            "languages": LANGUAGES,
            "filters": filters,
            "error": error,
            **pages("/console/functions", listed, lists.FUNCTION_ORDERS, q.get("cursor")),
            **context,
        },
    )


async def register(request: Request, user: User) -> Response:
    form = await request.form()
    kept = {k: str(form.get(k, "")) for k in FORM_FIELDS}
    try:
        body = _registration(kept, form.get("module"))
    except ValueError as exc:
        return await list_page(request, user, error=str(exc), form=kept)
    try:
        made = await perform(api.register_function, request, user, body=body)
    except CorralError as exc:
        return await list_page(request, user, error=exc.message, form=kept)
    name = made["function"]["name"]
    return RedirectResponse(f"/console/functions/{quote(name)}", status_code=303)


def _registration(fields: dict[str, str], module: Any) -> dict[str, Any]:
    """The register endpoint's body from the form; ``ValueError`` says what is wrong."""
    body: dict[str, Any] = {
        "name": fields["name"].strip(),
        "language": fields["language"],
        "entry_point": fields["entry_point"].strip() or "handler",
        "limits": {},
    }
    if fields["input_schema"].strip():
        try:
            body["input_schema"] = json.loads(fields["input_schema"])
        except json.JSONDecodeError as exc:
            raise ValueError(f"the input schema is not JSON: {exc}") from None
    for limit in ("timeout_s", "memory_mb"):
        if fields[limit].strip():
            body["limits"][limit] = fields[limit].strip()
    if isinstance(module, UploadFile) and module.filename:
        content = module.file.read()
        if content:
            body["module_base64"] = base64.b64encode(content).decode("ascii")
    if "module_base64" not in body:
        body["code"] = fields["code"]
    elif fields["code"].strip():
        raise ValueError("give source code or a module, not both")
    return body


async def detail(request: Request, user: User, **context: Any) -> Response:
    name = request.path_params["name"]
    tenant_id = request.query_params.get("tenant") if user.is_admin else user.tenant_id
    if not tenant_id:
        return render(request, user, "error.html", {"message": "name the function's tenant"}, 404)
    try:
        async with services_of(request).sessions() as session:
            fn = await repo.get(session, tenant_id=tenant_id, name=name)
            versions = [
                {**version_out(v).model_dump(mode="json"), "id": v.id}
                for v in await repo.versions(session, fn)
            ]
    except NotFound as exc:
        return render(request, user, "error.html", {"message": exc.message}, 404)
    refs = [*fn.aliases, *(str(v["version"]) for v in versions)]
    return render(
        request,
        user,
        "function.html",
        {
            "fn": function_out(fn).model_dump(mode="json"),
            "tenant_id": fn.tenant_id,
            "versions": versions,
            "refs": list(dict.fromkeys(refs)),
            **context,
        },
    )


async def invoke(request: Request, user: User) -> Response:
    form = await request.form()
    text = str(form.get("input", "")).strip() or "null"
    ref = str(form.get("version", "latest")) or "latest"
    shown = {"input": text, "version": ref}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return await detail(request, user, error=f"the input is not JSON: {exc}", invoked=shown)
    try:
        result = await perform(
            api.invoke_function_version,
            request,
            user,
            path={"name": request.path_params["name"], "version": ref},
            body=value,
        )
    except CorralError as exc:
        return await detail(request, user, error=exc.message, invoked=shown)
    result["output_json"] = json.dumps(result.get("output"), indent=2, ensure_ascii=False)
    return await detail(request, user, result=result, invoked=shown)
