"""Typed endpoints: a handler plus the pydantic models of its body, query and response.

``Endpoint.route()`` turns one into a Starlette ``Route`` whose wrapper authenticates,
parses and validates the input, calls the handler and serialises its result; the same
records generate the OpenAPI document (``app.http.openapi``), so the contract cannot
drift from the code.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.auth.principal import Admin, Principal
from app.errors import InvalidJSON, PayloadTooLarge, UnsupportedMediaType, ValidationFailed
from app.http import jsonbody

if TYPE_CHECKING:
    from app.services import Services

Auth = Literal["none", "tenant", "admin", "tenant_or_default", "tenant_or_admin"]


@dataclass(slots=True)
class Call:
    """What a handler receives."""

    request: Request
    principal: Principal | Admin | None
    body: Any = None
    query: Any = None

    @property
    def path(self) -> dict[str, Any]:
        return self.request.path_params

    @property
    def services(self) -> Services:
        services: Services = self.request.app.state.services
        return services

    @property
    def tenant(self) -> Principal:
        assert isinstance(self.principal, Principal)
        return self.principal


Handler = Callable[[Call], Awaitable[BaseModel | Response | None]]


@dataclass(slots=True)
class Endpoint:
    method: str
    path: str
    handler: Handler
    summary: str
    tags: list[str]
    auth: Auth = "tenant"
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    status: int = 200
    #: Error statuses beyond those every endpoint of its kind has (``app.http.openapi``).
    errors: tuple[int, ...] = ()
    #: The OpenAPI schema of a multipart/form-data body the handler reads itself.
    form: dict[str, Any] | None = None
    #: The media type of the streamed answer the handler gives instead of ``response``
    #: when asked to (e.g. ``application/x-ndjson``), and what its lines are.
    stream: tuple[str, str] | None = None

    def route(self) -> Route:
        async def endpoint(request: Request) -> Response:
            principal = await request.app.state.services.authenticator.authenticate(
                request, self.auth
            )
            call = Call(request=request, principal=principal)
            if self.query is not None:
                call.query = validate(self.query, dict(request.query_params), where="query")
            if self.body is not None:
                call.body = validate(self.body, await read_json(request), where="body")
            result = await self.handler(call)
            if isinstance(result, Response):
                return result
            if result is None:
                return Response(status_code=self.status)
            return JSONResponseBytes(result.model_dump_json().encode(), status_code=self.status)

        return Route(self.path, endpoint, methods=[self.method], name=self.handler.__name__)


class JSONResponseBytes(Response):
    media_type = "application/json"


def endpoint(
    method: str,
    path: str,
    *,
    summary: str,
    tags: list[str],
    auth: Auth = "tenant",
    body: type[BaseModel] | None = None,
    query: type[BaseModel] | None = None,
    response: type[BaseModel] | None = None,
    status: int = 200,
    errors: tuple[int, ...] = (),
    form: dict[str, Any] | None = None,
    stream: tuple[str, str] | None = None,
) -> Callable[[Handler], Endpoint]:
    def wrap(handler: Handler) -> Endpoint:
        return Endpoint(
            method,
            path,
            handler,
            summary,
            tags,
            auth,
            body,
            query,
            response,
            status,
            errors,
            form,
            stream,
        )

    return wrap


async def read_json(request: Request) -> Any:
    """The request's JSON body, size-bounded, parsed by ``app.http.jsonbody`` (bounded
    depth, strings that encode as UTF-8)."""
    content_type = request.headers.get("content-type", "application/json")
    if content_type.split(";")[0].strip().lower() not in ("application/json", ""):
        raise UnsupportedMediaType()
    raw = await request.body()
    limit = request.app.state.services.settings.max_body_bytes
    if len(raw) > limit:
        raise PayloadTooLarge(f"request body is over {limit} bytes")
    if not raw:
        raise InvalidJSON("request body is empty; a JSON object is required")
    return jsonbody.parse(raw)


def validate[M: BaseModel](model: type[M], data: Any, *, where: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ValidationFailed(
            f"{where} failed validation: " + _summary(exc), details=_details(exc, where)
        ) from None


def _details(exc: ValidationError, where: str) -> list[dict[str, Any]]:
    return [
        {"loc": [where, *err["loc"]], "msg": err["msg"], "type": err["type"]}
        for err in exc.errors(include_url=False, include_context=False, include_input=False)
    ]


def _summary(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False)[:3]:
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
