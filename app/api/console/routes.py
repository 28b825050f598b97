"""The console's pages (``/console``): each reads through the services and repositories
the API uses, scoped to the signed-in user; each change is a form posted with the
session's CSRF token and done by the API's own endpoint (``app.api.console.actions``)."""

from __future__ import annotations

import hmac
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from app.api.console import deletion as tenant_deletion
from app.api.console import functions as function_pages
from app.api.console import history, lists, names, overview
from app.api.console import live as live_updates
from app.api.console import sandboxes as sandbox_pages
from app.api.console.actions import perform
from app.api.console.pages import pages
from app.api.console.render import HERE, render, services_of
from app.api.console.sessions import COOKIE, LIFETIME, ConsoleSessions, User
from app.api.v1 import keys as key_routes
from app.api.v1 import run as run_routes
from app.api.v1 import tenants as tenant_routes
from app.api.v1.present import invocation_out
from app.auth.principal import Principal
from app.db import invocations as repo
from app.db import tenants as tenant_repo
from app.db.invocations import FINAL
from app.errors import CorralError, NotFound
from app.functions.languages import MAX_CODE_BYTES
from app.invocations import projection
from app.sandboxes import terminal
from app.schemas.usage import UsageQuery
from app.services import Services
from app.usage import report as usage_report
from app.usage.report import as_row

log = logging.getLogger(__name__)

LOGIN_COOKIE = "corral_console_login"
#: what a console form may hold: one uploaded file (a function's module; the whole body is
#: bounded by the gateway's body limit), a few dozen fields, a field as long as the
#: largest source text a function or a run takes
FORM_MAX_FILES = 1
FORM_MAX_FIELDS = 64
FORM_MAX_PART = MAX_CODE_BYTES + 1024
PAGE = 50
#: how often the live overview is sent
LIVE_EVERY_S = 2.0
#: how often a running invocation's page hears of it
INVOCATION_EVERY_S = 1.0

Page = Callable[[Request, User], Awaitable[Response]]


def _sessions(request: Request | WebSocket) -> ConsoleSessions:
    services: Services = request.app.state.services
    admin_key = services.settings.admin_key
    return ConsoleSessions(
        services.sessions,
        services.authenticator,
        admin_key.get_secret_value() if admin_key is not None else None,
    )


@dataclass(frozen=True)
class Confirm:
    """A destructive action asks first: ``question`` (and ``verb`` on its button), unless
    the form says ``confirmed=yes`` (the confirmation page's own form, or the page's
    script after the browser's dialog); ``back`` is where Cancel leads. ``applies``
    chooses the forms that need it (Enable needs none, Disable does)."""

    question: str
    verb: str
    back: str
    applies: Callable[[Any], bool] = lambda form: True


def page(
    handler: Page, *, admin: bool = False, confirm: Callable[[Request], Confirm] | None = None
) -> Callable[[Request], Awaitable[Response]]:
    """A page for signed-in users (``admin``: the operator only); a POST must carry the
    session's CSRF token, and one of a destructive action (``confirm``) its confirmation."""

    async def endpoint(request: Request) -> Response:
        try:
            return await checked(request)
        finally:
            await request.close()  # a form's uploaded files

    async def checked(request: Request) -> Response:
        user = await _sessions(request).resolve(request.cookies.get(COOKIE))
        if user is None:
            return RedirectResponse(f"/console/login?next={request.url.path}", status_code=303)
        if request.method not in ("GET", "HEAD"):
            sent = request.headers.get("x-csrf-token", "")
            if request.method == "POST":
                # parsed once here, bounded; handlers read the same form
                form = await request.form(
                    max_files=FORM_MAX_FILES,
                    max_fields=FORM_MAX_FIELDS,
                    max_part_size=FORM_MAX_PART,
                )
                sent = str(form.get("csrf", "")) or sent
            # any other method (an upload's PUT) carries it in its header: its body is
            # the file, streamed to the handler unread
            if not hmac.compare_digest(sent.encode(), user.csrf.encode()):
                return render(
                    request,
                    user,
                    "error.html",
                    {"message": "the form expired: reload the page"},
                    403,
                )
        if admin and not user.is_admin:
            return render(
                request, user, "error.html", {"message": "this page is the operator's"}, 403
            )
        if request.method == "POST" and confirm is not None:
            asked = confirm(request)
            form = await request.form()
            if asked.applies(form) and form.get("confirmed") != "yes":
                fields = [(k, str(v)) for k, v in form.multi_items() if isinstance(v, str)]
                return render(
                    request,
                    user,
                    "confirm.html",
                    {
                        "question": asked.question,
                        "verb": asked.verb,
                        "back": asked.back,
                        "action": request.url.path,
                        "fields": fields,
                    },
                )
        return await handler(request, user)

    return endpoint


def _back(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


# --- signing in -------------------------------------------------------------------------------
async def login_form(request: Request) -> Response:
    token = secrets.token_urlsafe(24)
    response = render(request, None, "login.html", {"login_token": token, "next": _next(request)})
    _cookie(response, LOGIN_COOKIE, token, request, max_age=600)
    return response


async def login(request: Request) -> Response:
    form = await request.form()
    token = request.cookies.get(LOGIN_COOKIE, "")
    if not token or not hmac.compare_digest(
        str(form.get("login_token", "")).encode(), token.encode()
    ):
        return render(
            request,
            None,
            "login.html",
            {"error": "the form expired: try again", "login_token": "", "next": "/console"},
            403,
        )
    key = str(form.get("api_key", "")).strip()
    try:
        session_token = await _sessions(request).sign_in(key)
    except CorralError as exc:
        fresh = secrets.token_urlsafe(24)
        response = render(
            request,
            None,
            "login.html",
            {"error": exc.message, "login_token": fresh, "next": _next(request, form.get("next"))},
            exc.status,
        )
        _cookie(response, LOGIN_COOKIE, fresh, request, max_age=600)
        return response
    response = _back(_next(request, form.get("next")))
    _cookie(response, COOKIE, session_token, request, max_age=int(LIFETIME.total_seconds()))
    response.delete_cookie(LOGIN_COOKIE, path="/console")
    return response


async def logout(request: Request, user: User) -> Response:
    await _sessions(request).sign_out(request.cookies.get(COOKIE))
    response = _back("/console/login")
    response.delete_cookie(COOKIE, path="/console")
    return response


def _next(request: Request, value: Any = None) -> str:
    target = str(value if value is not None else request.query_params.get("next", "/console"))
    # only a page of the console: never another site
    return target if target.startswith("/console") and "//" not in target else "/console"


def _cookie(response: Response, name: str, value: str, request: Request, *, max_age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/console",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


# --- overview ---------------------------------------------------------------------------------
async def home(request: Request, user: User) -> Response:
    services = services_of(request)
    live = await overview.snapshot(services, user.tenant_id)
    span = history.SPANS.get(request.query_params.get("span", ""), history.SPANS["hour"])
    async with services.sessions() as session:
        past = await history.series(
            session, tenant_id=user.tenant_id, span=span, now=datetime.now(UTC)
        )
    return render(request, user, "overview.html", {"live": live, "history": past})


async def live(request: Request, user: User) -> Response:
    """Server-sent events: the overview's figures every ``LIVE_EVERY_S``."""
    services = services_of(request)

    async def read() -> dict[str, Any]:
        return await overview.snapshot(services, user.tenant_id)

    return live_updates.events("overview", read, every_s=LIVE_EVERY_S)


# --- tenants (the operator) -------------------------------------------------------------------
async def tenants_page(request: Request, user: User, **context: Any) -> Response:
    after = request.query_params.get("after")
    async with services_of(request).sessions() as session:
        rows = await tenant_repo.list_tenants(session, limit=PAGE, after=after)
    more = rows[-1].id if len(rows) == PAGE else None
    return render(request, user, "tenants.html", {"tenants": rows, "more": more, **context})


async def create_tenant(request: Request, user: User) -> Response:
    form = await request.form()
    try:
        created = await perform(
            tenant_routes.create_tenant, request, user, body={"name": str(form.get("name", ""))}
        )
    except CorralError as exc:
        return await tenants_page(request, user, error=exc.message)
    return await tenant_page(
        request, user, tenant_id=created["tenant"]["id"], new_key=created["key"]["api_key"]
    )


async def tenant_page(
    request: Request, user: User, *, tenant_id: str | None = None, **context: Any
) -> Response:
    tenant_id = tenant_id or request.path_params["tenant_id"]
    try:
        tenant = await perform(
            tenant_routes.get_tenant, request, user, path={"tenant_id": tenant_id}
        )
        listed = await perform(
            tenant_routes.list_keys, request, user, path={"tenant_id": tenant_id}
        )
    except NotFound as exc:
        return render(request, user, "error.html", {"message": exc.message}, 404)
    return render(
        request, user, "tenant.html", {"tenant": tenant, "keys": listed["keys"], **context}
    )


async def update_tenant(request: Request, user: User) -> Response:
    tenant_id = request.path_params["tenant_id"]
    form = await request.form()
    body: dict[str, Any] = {}
    if "disabled" in form:
        body["disabled"] = form["disabled"] == "true"
    quota = {k[6:]: v for k, v in form.items() if k.startswith("quota.") and str(v).strip()}
    if quota:
        body["quota"] = quota
    try:
        await perform(
            tenant_routes.update_tenant, request, user, path={"tenant_id": tenant_id}, body=body
        )
    except CorralError as exc:
        return await tenant_page(request, user, error=exc.message)
    return _back(f"/console/tenants/{tenant_id}?saved=1")


async def create_key(request: Request, user: User) -> Response:
    tenant_id = request.path_params["tenant_id"]
    form = await request.form()
    try:
        created = await perform(
            tenant_routes.create_key,
            request,
            user,
            path={"tenant_id": tenant_id},
            body={"name": str(form.get("name", ""))},
        )
    except CorralError as exc:
        return await tenant_page(request, user, error=exc.message)
    return await tenant_page(request, user, new_key=created["api_key"])


def _killing(request: Request) -> Confirm:
    sandbox_id = request.path_params["sandbox_id"]
    return Confirm(
        f"Kill the sandbox {sandbox_id}? Its processes and files are gone for good.",
        "Kill",
        f"/console/sandboxes/{sandbox_id}",
    )


def _revoking(request: Request) -> Confirm:
    return _revoking_key(request, f"/console/tenants/{request.path_params['tenant_id']}")


def _revoking_key(request: Request, back: str) -> Confirm:
    key_id = request.path_params["key_id"]
    return Confirm(
        f"Revoke the key {key_id}? Every client and console session using it is refused at once.",
        "Revoke",
        back,
    )


def _disabling(request: Request) -> Confirm:
    tenant_id = request.path_params["tenant_id"]
    return Confirm(
        f"Disable the tenant {tenant_id}? All its keys are refused until it is enabled again.",
        "Disable",
        f"/console/tenants/{tenant_id}",
        applies=lambda form: form.get("disabled") == "true",
    )


def _deleting(request: Request) -> Confirm:
    tenant_id = request.path_params["tenant_id"]
    return Confirm(
        f"Delete the tenant {tenant_id}? Its keys are revoked and its sandboxes ended, for good.",
        "Delete",
        f"/console/tenants/{tenant_id}",
    )


async def revoke_key(request: Request, user: User) -> Response:
    path = dict(request.path_params)
    try:
        await perform(tenant_routes.revoke_key, request, user, path=path)
    except CorralError as exc:
        return await tenant_page(request, user, error=exc.message)
    return _back(f"/console/tenants/{path['tenant_id']}")


# --- a tenant's own keys ------------------------------------------------------------------------
async def own_keys(request: Request, user: User, **context: Any) -> Response:
    if user.is_admin:
        return _back("/console/tenants")  # the operator manages keys tenant by tenant
    listed = await perform(key_routes.list_own_keys, request, user)
    return render(request, user, "keys.html", {"keys": listed["keys"], **context})


async def create_own_key(request: Request, user: User) -> Response:
    form = await request.form()
    try:
        created = await perform(
            key_routes.create_own_key, request, user, body={"name": str(form.get("name", ""))}
        )
    except CorralError as exc:
        return await own_keys(request, user, error=exc.message)
    return await own_keys(request, user, new_key=created["api_key"])


async def revoke_own_key(request: Request, user: User) -> Response:
    try:
        await perform(
            key_routes.revoke_own_key,
            request,
            user,
            path={"key_id": request.path_params["key_id"]},
        )
    except CorralError as exc:
        return await own_keys(request, user, error=exc.message)
    return _back("/console/keys")


def _revoking_own(request: Request) -> Confirm:
    return _revoking_key(request, "/console/keys")


# --- running code and the invocations ---------------------------------------------------------
async def run_form(request: Request, user: User, **context: Any) -> Response:
    runtimes = await services_of(request).catalogue.nodes()
    languages = sorted(services_of(request).catalogue.languages(runtimes))
    return render(request, user, "run.html", {"languages": languages, **context})


async def run_code(request: Request, user: User) -> Response:
    form = await request.form()
    body = {
        "language": str(form.get("language", "")),
        "code": str(form.get("code", "")),
        "stdin": str(form.get("stdin", "")),
    }
    try:
        answer = await perform(run_routes.run, request, user, body=body)
    except CorralError as exc:
        return await run_form(request, user, error=exc.message, form=body)
    return _back(f"/console/invocations/{answer['invocation_id']}")


FILTERS = ("status", "language", "kind", "function", "since", "before")


async def invocations_page(request: Request, user: User) -> Response:
    q = request.query_params
    filters = {k: q.get(k, "") for k in FILTERS}
    if user.is_admin:
        filters["tenant"] = q.get("tenant", "")
    error = None
    async with services_of(request).sessions() as session:
        listed, refused = await lists.safely(
            "invocations",
            session,
            tenant_id=user.tenant_id,
            filters=filters,
            sort=q.get("sort"),
            cursor=q.get("cursor"),
        )
        error = refused or error
        rows = listed.rows
        tenant_names = await names.tenants(session, (r.tenant_id for r in rows))
        functions = await names.function_versions(session, (r.function_version_id for r in rows))
    base = "/console/invocations"
    return render(
        request,
        user,
        "invocations.html",
        {
            "rows": rows,
            "filters": filters,
            "error": error,
            "tenant_names": tenant_names,
            "functions": functions,
            **pages(base, listed, lists.INVOCATION_ORDERS, q.get("cursor")),
        },
    )


async def invocation_live(request: Request, user: User) -> Response:
    """Server-sent events: an invocation's status until it is final."""
    sessions = services_of(request).sessions
    invocation_id = request.path_params["invocation_id"]

    async def read() -> dict[str, Any]:
        async with sessions() as session:
            row = await repo.get(session, tenant_id=user.tenant_id, invocation_id=invocation_id)
        return {"status": row.status, "final": row.status in FINAL, "attempts": row.attempts}

    try:
        first = await read()
    except NotFound as exc:
        return render(request, user, "error.html", {"message": exc.message}, 404)
    return live_updates.events(
        "invocation", read, every_s=INVOCATION_EVERY_S, done=lambda f: f["final"], first=first
    )


async def invocation_page(request: Request, user: User) -> Response:
    sessions = services_of(request).sessions
    try:
        async with sessions() as session:
            row = await repo.get(
                session,
                tenant_id=user.tenant_id,
                invocation_id=request.path_params["invocation_id"],
            )
    except NotFound as exc:
        return render(request, user, "error.html", {"message": exc.message}, 404)
    shown = invocation_out(row, await projection.load(sessions, row)).model_dump(mode="json")
    request_fields = row.request or {}
    async with sessions() as session:
        tenant_name = (await names.tenants(session, [row.tenant_id])).get(row.tenant_id, "")
        function = (await names.function_versions(session, [row.function_version_id])).get(
            row.function_version_id or "", ""
        )
    function_input = (
        json.dumps(request_fields["input"], indent=2, ensure_ascii=False)
        if row.kind == "function" and "input" in request_fields
        else ""
    )
    return render(
        request,
        user,
        "invocation.html",
        {
            "inv": shown,
            "row": row,
            "code": request_fields.get("code", ""),
            "stdin": request_fields.get("stdin", ""),
            "tenant_name": tenant_name,
            "function": function,
            "function_input": function_input,
        },
    )


# --- usage and cost ---------------------------------------------------------------------------
async def _usage(
    request: Request, user: User
) -> tuple[UsageQuery, datetime, datetime, list[usage_report.Line]] | Response:
    """The usage the page (and its CSV) shows: the query's range, 7 days by default; a
    tenant's own, the operator's of everyone or of one tenant."""
    params = {k: v for k, v in request.query_params.items() if v and k != "format"}
    params.setdefault("group_by", "day,kind" if not user.is_admin else "day,tenant")
    try:
        query = UsageQuery.model_validate(params)
    except ValidationError as exc:
        return render(request, user, "error.html", {"message": str(exc.errors()[0]["msg"])}, 422)
    end = query.end or datetime.now(UTC)
    start = query.start or end - timedelta(days=7)
    tenant_id = query.tenant if user.is_admin else user.tenant_id
    prices = services_of(request).settings.prices
    async with services_of(request).sessions() as session:
        lines = await usage_report.report(
            session, start=start, end=end, group_by=query.groups, prices=prices, tenant_id=tenant_id
        )
    return query, start, end, lines


async def usage_page(request: Request, user: User) -> Response:
    found = await _usage(request, user)
    if isinstance(found, Response):
        return found
    query, start, end, lines = found
    rows = [as_row(line) for line in lines]
    return render(
        request,
        user,
        "usage.html",
        {
            "rows": rows,
            "groups": query.groups,
            "group_by": query.group_by,
            "start": start,
            "end": end,
            "currency": services_of(request).settings.prices.currency,
            "chart": _chart(rows, query.groups),
            # the same figures as CSV, through the console's session (not /v1: its
            # cookie is the console's, and /v1 asks for an API key)
            "csv": f"/console/usage.csv?{request.url.query}"
            if request.url.query
            else "/console/usage.csv",
        },
    )


def same_origin(websocket: WebSocket) -> bool:
    """Whether the connection comes from a page of this console: its ``Origin`` names the
    host it connects to (a page of another site may open a WebSocket here, with the
    browser sending the console's cookie: cross-site WebSocket hijacking)."""
    origin = websocket.headers.get("origin")
    if not origin:
        return False
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc == websocket.headers.get("host")


async def sandbox_terminal(websocket: WebSocket) -> None:
    """A sandbox's terminal for the signed-in tenant (``app.sandboxes.terminal``). The
    operator's session is refused, as on the sandbox's page (acting in a sandbox is its
    tenant's); so is a connection from another origin, before it is accepted."""
    user = None
    if same_origin(websocket):
        user = await _sessions(websocket).resolve(websocket.cookies.get(COOKIE))
    if user is None or not isinstance(user.principal, Principal):
        await websocket.close(1008, "sign in to the console as the sandbox's tenant")
        return
    services: Services = websocket.app.state.services
    await terminal.serve(websocket, services, user.principal, websocket.path_params["sandbox_id"])


async def to_console(request: Request) -> Response:
    return RedirectResponse("/console", status_code=307)


async def usage_csv(request: Request, user: User) -> Response:
    found = await _usage(request, user)
    if isinstance(found, Response):
        return found
    query, start, end, lines = found
    name = f"corral-usage-{start:%Y%m%d}-{end:%Y%m%d}.csv"
    return Response(
        usage_report.as_csv(query.groups, lines),
        media_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


def _chart(rows: list[dict[str, Any]], groups: Sequence[str]) -> dict[str, Any] | None:
    """Cost over time, one series per value of the other grouping: what the page draws."""
    axis = next((g for g in groups if g in ("day", "hour")), None)
    if axis is None:
        return None
    other = next((g for g in groups if g != axis), None)
    labels = sorted({r[axis] for r in rows})
    series: dict[str, dict[str, float]] = {}
    for r in rows:
        name = r[other] if other else "cost"
        series.setdefault(name or "-", {})[r[axis]] = (
            series.get(name or "-", {}).get(r[axis], 0.0) + r["cost"]
        )
    return {
        "labels": labels,
        "series": [
            {"name": name, "values": [round(points.get(x, 0.0), 6) for x in labels]}
            for name, points in sorted(series.items())
        ],
    }


def routes() -> list[BaseRoute]:
    return [
        Route("/", to_console, methods=["GET"]),  # a browser pointed at the server
        Route("/console/login", login_form, methods=["GET"]),
        Route("/console/login", login, methods=["POST"]),
        Route("/console/logout", page(logout), methods=["POST"]),
        Route("/console", page(home), methods=["GET"]),
        Route("/console/live", page(live), methods=["GET"]),
        Route("/console/tenants", page(tenants_page, admin=True), methods=["GET"]),
        Route("/console/tenants", page(create_tenant, admin=True), methods=["POST"]),
        Route("/console/tenants/{tenant_id}", page(tenant_page, admin=True), methods=["GET"]),
        Route(
            "/console/tenants/{tenant_id}",
            page(update_tenant, admin=True, confirm=_disabling),
            methods=["POST"],
        ),
        Route("/console/tenants/{tenant_id}/keys", page(create_key, admin=True), methods=["POST"]),
        Route(
            "/console/tenants/{tenant_id}/delete",
            page(tenant_deletion.delete_form, admin=True),
            methods=["GET"],
        ),
        Route(
            "/console/tenants/{tenant_id}/delete",
            page(tenant_deletion.delete_tenant, admin=True, confirm=_deleting),
            methods=["POST"],
        ),
        Route(
            "/console/tenants/{tenant_id}/keys/{key_id}/revoke",
            page(revoke_key, admin=True, confirm=_revoking),
            methods=["POST"],
        ),
        Route("/console/run", page(run_form), methods=["GET"]),
        Route("/console/run", page(run_code), methods=["POST"]),
        Route("/console/functions", page(function_pages.list_page), methods=["GET"]),
        Route("/console/functions", page(function_pages.register), methods=["POST"]),
        Route("/console/functions/{name}", page(function_pages.detail), methods=["GET"]),
        Route("/console/functions/{name}/invoke", page(function_pages.invoke), methods=["POST"]),
        Route("/console/invocations", page(invocations_page), methods=["GET"]),
        Route("/console/invocations/{invocation_id}", page(invocation_page), methods=["GET"]),
        Route(
            "/console/invocations/{invocation_id}/live",
            page(invocation_live),
            methods=["GET"],
        ),
        Route("/console/usage", page(usage_page), methods=["GET"]),
        Route("/console/keys", page(own_keys), methods=["GET"]),
        Route("/console/keys", page(create_own_key), methods=["POST"]),
        Route(
            "/console/keys/{key_id}/revoke",
            page(revoke_own_key, confirm=_revoking_own),
            methods=["POST"],
        ),
        Route("/console/usage.csv", page(usage_csv), methods=["GET"]),
        Route("/console/sandboxes", page(sandbox_pages.list_page), methods=["GET"]),
        Route("/console/sandboxes", page(sandbox_pages.create), methods=["POST"]),
        Route("/console/sandboxes/{sandbox_id}", page(sandbox_pages.detail), methods=["GET"]),
        Route("/console/sandboxes/{sandbox_id}/live", page(sandbox_pages.live), methods=["GET"]),
        Route(
            "/console/sandboxes/{sandbox_id}/files",
            page(sandbox_pages.upload),
            methods=["PUT"],
        ),
        Route(
            "/console/sandboxes/{sandbox_id}/files/download",
            page(sandbox_pages.download),
            methods=["GET"],
        ),
        Route(
            "/console/sandboxes/{sandbox_id}/exec",
            page(sandbox_pages.run_command),
            methods=["POST"],
        ),
        *(
            Route(
                f"/console/sandboxes/{{sandbox_id}}/{name}",
                page(sandbox_pages.action(name), confirm=_killing if name == "kill" else None),
                methods=["POST"],
            )
            for name in ("pause", "resume", "kill")
        ),
        WebSocketRoute("/console/sandboxes/{sandbox_id}/terminal", sandbox_terminal),
        Mount("/console/static", StaticFiles(directory=HERE / "static"), name="console-static"),
    ]
