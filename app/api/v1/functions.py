"""``/v1/functions``: a tenant's registry of tool functions, and invoking them.

Registration takes the artifact as JSON (``code``, or ``module_base64`` for a ``.wasm``
module) at ``POST /v1/functions``, or as a multipart upload (a ``manifest`` field holding
the JSON of ``FunctionManifest`` and an ``artifact`` file) at
``POST /v1/functions/{name}/versions``. Every read is scoped to the calling tenant:
another tenant's function is a 404 like a missing one.
"""

from __future__ import annotations

import base64
import re

from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response

from app.db import functions as repo
from app.db import invocations
from app.db.models import Function, FunctionVersion
from app.errors import NotFound, PayloadTooLarge, UnsupportedMediaType, ValidationFailed
from app.functions import outcome, service
from app.functions.languages import MAX_CODE_BYTES, MAX_MODULE_BYTES
from app.http.endpoint import Call, JSONResponseBytes, endpoint
from app.invocations import projection
from app.schemas.functions import (
    ALIAS_PATTERN,
    NAME_PATTERN,
    AcceptedResponse,
    AliasSet,
    BatchInvokeRequest,
    BatchInvokeResponse,
    FunctionCreate,
    FunctionDetail,
    FunctionInput,
    FunctionList,
    FunctionManifest,
    FunctionOut,
    InvokeQuery,
    InvokeResponse,
    RegisterResponse,
    VersionList,
    VersionOut,
)

TAGS = ["functions"]

#: The multipart body of ``upload_function`` (read by the handler, documented here).
UPLOAD_FORM = {
    "type": "object",
    "properties": {
        "manifest": {"type": "string", "description": "the JSON of FunctionManifest"},
        "artifact": {"type": "string", "format": "binary", "description": "code or .wasm"},
    },
    "required": ["manifest", "artifact"],
}


def function_out(fn: Function) -> FunctionOut:
    return FunctionOut(
        name=fn.name,
        language=fn.language,
        aliases={k: int(v) for k, v in sorted(fn.aliases.items())},
        created_at=fn.created_at,
    )


def version_out(version: FunctionVersion) -> VersionOut:
    return VersionOut(
        version=version.version,
        content_hash=version.content_hash,
        language=version.language,
        entry_point=version.entry_point,
        input_schema=version.input_schema,
        limits=version.limits,
        created_at=version.created_at,
    )


def _registered(fn: Function, version: FunctionVersion, created: bool) -> Response:
    body = RegisterResponse(
        function=function_out(fn), version=version_out(version), created=created
    )
    return JSONResponseBytes(body.model_dump_json().encode(), status_code=201 if created else 200)


@endpoint(
    "POST",
    "/v1/functions",
    summary="Register a function, or a new version of it (artifact in the JSON body)",
    tags=TAGS,
    body=FunctionCreate,
    response=RegisterResponse,
    status=201,
    errors=(409,),
)
async def register_function(call: Call) -> Response:
    body: FunctionCreate = call.body
    if (body.code is None) == (body.module_base64 is None):
        raise ValidationFailed("give exactly one of code and module_base64")
    if body.code is not None:
        content = body.code.encode("utf-8")
    else:
        assert body.module_base64 is not None
        if len(body.module_base64) > (MAX_MODULE_BYTES + 2) // 3 * 4:
            raise PayloadTooLarge(f"the module is over {MAX_MODULE_BYTES} bytes")
        try:
            content = base64.b64decode(body.module_base64, validate=True)
        except ValueError:  # binascii.Error, or a character that is not ASCII
            raise ValidationFailed("module_base64 is not valid base64") from None
    manifest = FunctionManifest.model_validate(body.model_dump(include=_MANIFEST_FIELDS))
    fn, version, created = await service.register(
        call.services, call.tenant, name=body.name, manifest=manifest, content=content
    )
    return _registered(fn, version, created)


_MANIFEST_FIELDS = set(FunctionManifest.model_fields)


@endpoint(
    "POST",
    "/v1/functions/{name}/versions",
    summary="Register a version as a multipart upload: manifest (JSON) and artifact (file)",
    tags=TAGS,
    response=RegisterResponse,
    status=201,
    errors=(409,),
    form=UPLOAD_FORM,
)
async def upload_function(call: Call) -> Response:
    name = call.path["name"]
    if not _matches(NAME_PATTERN, name):
        raise ValidationFailed(f"{name!r} is not a valid function name ({NAME_PATTERN})")
    manifest_text, content = await _read_upload(call.request)
    try:
        manifest = FunctionManifest.model_validate_json(manifest_text)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise ValidationFailed(
            f"manifest failed validation: {where}: {first['msg']}",
            details=[
                {"loc": ["manifest", *e["loc"]], "msg": e["msg"], "type": e["type"]}
                for e in exc.errors(include_url=False, include_context=False, include_input=False)
            ],
        ) from None
    fn, version, created = await service.register(
        call.services, call.tenant, name=name, manifest=manifest, content=content
    )
    return _registered(fn, version, created)


async def _read_upload(request: Request) -> tuple[str, bytes]:
    """The ``manifest`` text and ``artifact`` bytes of a multipart body, size-bounded.

    The whole body is bounded by the gateway's ``max_body_bytes`` (middleware); the
    artifact is read at most one byte past the module limit.
    """
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "multipart/form-data":
        raise UnsupportedMediaType("request body must be multipart/form-data")
    async with request.form(max_files=1, max_fields=1, max_part_size=MAX_CODE_BYTES) as form:
        manifest = form.get("manifest")
        artifact = form.get("artifact")
        if not isinstance(manifest, str):
            raise ValidationFailed("the multipart body needs a 'manifest' field (JSON)")
        if not isinstance(artifact, UploadFile):
            raise ValidationFailed("the multipart body needs an 'artifact' file")
        content = await artifact.read(MAX_MODULE_BYTES + 1)
    if len(content) > MAX_MODULE_BYTES:
        raise PayloadTooLarge(f"the artifact is over {MAX_MODULE_BYTES} bytes")
    return manifest, content


@endpoint(
    "GET", "/v1/functions", summary="The tenant's functions", tags=TAGS, response=FunctionList
)
async def list_functions(call: Call) -> FunctionList:
    async with call.services.sessions() as session:
        rows = await repo.list_for_tenant(session, tenant_id=call.tenant.tenant_id)
    return FunctionList(functions=[function_out(fn) for fn in rows])


@endpoint(
    "GET",
    "/v1/functions/{name}",
    summary="One function and its latest version",
    tags=TAGS,
    response=FunctionDetail,
)
async def get_function(call: Call) -> FunctionDetail:
    async with call.services.sessions() as session:
        fn = await repo.get(session, tenant_id=call.tenant.tenant_id, name=call.path["name"])
        latest = await repo.resolve(session, fn, None)
    return FunctionDetail(**function_out(fn).model_dump(), latest=version_out(latest))


@endpoint(
    "GET",
    "/v1/functions/{name}/versions",
    summary="A function's versions, newest first",
    tags=TAGS,
    response=VersionList,
)
async def list_versions(call: Call) -> VersionList:
    async with call.services.sessions() as session:
        fn = await repo.get(session, tenant_id=call.tenant.tenant_id, name=call.path["name"])
        rows = await repo.versions(session, fn)
    return VersionList(versions=[version_out(v) for v in rows])


@endpoint(
    "DELETE",
    "/v1/functions/{name}",
    summary="Delete a function (soft: its history stays; invoking it is a 404)",
    tags=TAGS,
    status=204,
)
async def delete_function(call: Call) -> None:
    async with call.services.sessions.begin() as session:
        await repo.soft_delete(session, tenant_id=call.tenant.tenant_id, name=call.path["name"])
    call.services.resolver.forget(call.tenant.tenant_id, call.path["name"])


@endpoint(
    "PUT",
    "/v1/functions/{name}/aliases/{alias}",
    summary="Point an alias (e.g. stable) at a version",
    tags=TAGS,
    body=AliasSet,
    response=FunctionOut,
)
async def set_alias(call: Call) -> FunctionOut:
    alias = call.path["alias"]
    if not _matches(ALIAS_PATTERN, alias):
        raise ValidationFailed(f"{alias!r} is not a valid alias ({ALIAS_PATTERN})")
    body: AliasSet = call.body
    async with call.services.sessions.begin() as session:
        fn = await repo.set_alias(
            session,
            tenant_id=call.tenant.tenant_id,
            name=call.path["name"],
            alias=alias,
            version=body.version,
        )
    call.services.resolver.forget(call.tenant.tenant_id, call.path["name"])
    return function_out(fn)


@endpoint(
    "DELETE",
    "/v1/functions/{name}/aliases/{alias}",
    summary="Remove an alias",
    tags=TAGS,
    response=FunctionOut,
)
async def delete_alias(call: Call) -> FunctionOut:
    async with call.services.sessions.begin() as session:
        fn = await repo.delete_alias(
            session,
            tenant_id=call.tenant.tenant_id,
            name=call.path["name"],
            alias=call.path["alias"],
        )
    call.services.resolver.forget(call.tenant.tenant_id, call.path["name"])
    return function_out(fn)


def _wants_async(request: Request) -> bool:
    prefer = request.headers.get("prefer", "")
    return any(p.strip().lower() == "respond-async" for p in prefer.split(","))


async def _invoke(call: Call, ref: str | None) -> InvokeResponse | Response:
    body: FunctionInput = call.body
    target = await service.target(call.services, call.tenant, name=call.path["name"], ref=ref)
    if not _wants_async(call.request):
        return await service.invoke(call.services, call.tenant, target, body.root)
    invocation_id = await service.submit(call.services, call.tenant, target, body.root)
    accepted = AcceptedResponse(
        invocation_id=invocation_id,
        function=target.name,
        version=target.version.version,
        poll=f"/v1/invocations/{invocation_id}",
        result=f"/v1/functions/{target.name}/invocations/{invocation_id}",
    )
    return JSONResponseBytes(
        accepted.model_dump_json().encode(),
        status_code=202,
        headers={"Preference-Applied": "respond-async", "Location": accepted.result},
    )


@endpoint(
    "POST",
    "/v1/functions/{name}/invoke",
    summary="Invoke a function: the body is its JSON input (Prefer: respond-async for 202)",
    tags=TAGS,
    body=FunctionInput,
    query=InvokeQuery,
    response=InvokeResponse,
    errors=(429, 504),
)
async def invoke_function(call: Call) -> InvokeResponse | Response:
    return await _invoke(call, call.query.version)


@endpoint(
    "POST",
    "/v1/functions/{name}/versions/{version}/invoke",
    summary="Invoke one version (a number or an alias) of a function",
    tags=TAGS,
    body=FunctionInput,
    response=InvokeResponse,
    errors=(429, 504),
)
async def invoke_function_version(call: Call) -> InvokeResponse | Response:
    return await _invoke(call, call.path["version"])


@endpoint(
    "POST",
    "/v1/functions/{name}/invoke/batch",
    summary="Invoke a function on many inputs, concurrently; results in input order",
    tags=TAGS,
    body=BatchInvokeRequest,
    query=InvokeQuery,
    response=BatchInvokeResponse,
)
async def invoke_function_batch(call: Call) -> BatchInvokeResponse:
    body: BatchInvokeRequest = call.body
    target = await service.target(
        call.services, call.tenant, name=call.path["name"], ref=call.query.version
    )
    items = await service.invoke_batch(call.services, call.tenant, target, list(body.inputs))
    return BatchInvokeResponse(function=target.name, version=target.version.version, results=items)


@endpoint(
    "GET",
    "/v1/functions/{name}/invocations/{invocation_id}",
    summary="One invocation of a function, as a function result (poll after a 202)",
    tags=TAGS,
    response=InvokeResponse,
)
async def get_function_invocation(call: Call) -> InvokeResponse:
    tenant_id = call.tenant.tenant_id
    invocation_id = call.path["invocation_id"]
    async with call.services.sessions() as session:
        row = await invocations.get(session, tenant_id=tenant_id, invocation_id=invocation_id)
        if row.kind != "function" or row.function_version_id is None:
            raise NotFound(f"no invocation {invocation_id!r} of function {call.path['name']!r}")
        fn, version = await repo.version_by_id(
            session, tenant_id=tenant_id, version_id=row.function_version_id
        )
    if fn.name != call.path["name"]:
        raise NotFound(f"no invocation {invocation_id!r} of function {call.path['name']!r}")
    loaded = await projection.load(call.services.sessions, row)
    return outcome.invoke_response(row, loaded, function=fn.name, version=version.version)


def _matches(pattern: str, value: str) -> bool:
    return re.fullmatch(pattern, value) is not None


endpoints = [
    register_function,
    upload_function,
    list_functions,
    get_function,
    list_versions,
    delete_function,
    set_alias,
    delete_alias,
    invoke_function,
    invoke_function_version,
    invoke_function_batch,
    get_function_invocation,
]
