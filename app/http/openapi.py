"""Build the OpenAPI 3.1 document from the typed endpoints.

Every error status an operation can answer is documented: 400, 401 and 403 where a key
is needed (400: two different keys, ``app.auth.credentials``), 503 wherever the database
is read (``database_unavailable``), 404 and 422 where the path has parameters,
400/413/415/422 where there is a body, 422 where there is a query, and the endpoint's
own ``errors`` (409, 429, 504, ...). ``tests/app/http/test_schemathesis.py`` holds every
answer to it.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from app.http.endpoint import Endpoint
from app.schemas.common import ErrorResponse

Mode = Literal["validation", "serialization"]
_REF = "#/components/schemas/{model}"
_PATH_PARAM = re.compile(r"{(\w+)(?::\w+)?}")
_AUTH_ERRORS = {  # 400: two different keys (``conflicting_credentials``)
    "tenant": (400, 401, 403),
    "admin": (400, 401, 403),
    "tenant_or_default": (400, 401, 403),
    "tenant_or_admin": (400, 401, 403),
}


def build(endpoints: list[Endpoint], *, title: str, version: str) -> dict[str, Any]:
    models: set[type[BaseModel]] = {ErrorResponse}
    for ep in endpoints:
        models.update(m for m in (ep.body, ep.response) if m is not None)
    modes: tuple[Mode, Mode] = ("validation", "serialization")
    keyed = [(m, mode) for m in sorted(models, key=lambda m: m.__name__) for mode in modes]
    refs, defs = models_json_schema(keyed, ref_template=_REF)
    paths: dict[str, dict[str, Any]] = {}
    for ep in endpoints:
        path = _PATH_PARAM.sub(r"{\1}", ep.path)
        op: dict[str, Any] = {
            "operationId": ep.handler.__name__,
            "summary": ep.summary,
            "tags": ep.tags,
            "parameters": [
                {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                for name in _PATH_PARAM.findall(ep.path)
            ],
            "responses": {},
        }
        if ep.query is not None:
            op["parameters"] += _query_parameters(ep.query)
        if ep.body is not None:
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": refs[(ep.body, "validation")]}},
            }
        elif ep.form is not None:
            op["requestBody"] = {
                "required": True,
                "content": {"multipart/form-data": {"schema": ep.form}},
            }
        ok: dict[str, Any] = {"description": "OK"}
        if ep.response is not None:
            ok["content"] = {"application/json": {"schema": refs[(ep.response, "serialization")]}}
        if ep.stream is not None:
            media_type, lines = ep.stream
            ok.setdefault("content", {})[media_type] = {
                "schema": {"type": "string", "description": lines}
            }
        op["responses"][str(ep.status)] = ok
        error_ref = refs[(ErrorResponse, "serialization")]
        has_body = ep.body is not None or ep.form is not None
        for status in sorted(
            {
                *_AUTH_ERRORS.get(ep.auth, ()),
                *((503,) if ep.auth != "none" else ()),
                *((404, 422) if _PATH_PARAM.search(ep.path) else ()),
                *((400, 413, 415, 422) if has_body else ()),
                *((422,) if ep.query is not None else ()),
                *ep.errors,
            }
        ):
            op["responses"][str(status)] = {
                "description": "Error",
                "content": {"application/json": {"schema": error_ref}},
            }
        if ep.auth != "none":
            op["security"] = [{"bearer": []}, {"apiKey": []}]
        paths.setdefault(path, {})[ep.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            },
        },
    }


def _query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    schema = model.model_json_schema()
    required = set(schema.get("required", []))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": prop}
        for name, prop in schema.get("properties", {}).items()
    ]
