"""The console's sandbox pages: a tenant lists, creates, opens, runs commands in,
browses, pauses, resumes and kills its sandboxes, each through the sandbox API's own
endpoint; the operator sees every tenant's, read-only (acting in a sandbox is its
tenant's)."""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from app.api.console import lists, names
from app.api.console import live as live_updates
from app.api.console.actions import perform
from app.api.console.pages import pages
from app.api.console.render import render, services_of
from app.api.console.sessions import User
from app.api.v1 import sandboxes as api
from app.db.models import Sandbox, UsageEvent
from app.errors import CorralError, NotFound

PAGE = 50
#: how often a sandbox's page hears of it
LIVE_EVERY_S = 2.0
#: metered intervals shown on a sandbox's page at most
METERED = 240
STATES = ("live", "running", "paused", "creating", "stopping", "stopped", "any")


FILTERS = ("state", "image", "backend", "label", "since", "before")


async def list_page(request: Request, user: User, **context: Any) -> Response:
    """The user's sandboxes (the operator: everyone's), filtered and sorted
    (``app.api.console.lists``)."""
    q = request.query_params
    filters = {k: q.get(k, "") for k in FILTERS}
    filters["state"] = filters["state"] if filters["state"] in STATES else "live"
    if user.is_admin:
        filters["tenant"] = q.get("tenant", "")
    error = context.pop("error", None)
    async with services_of(request).sessions() as session:
        listed, refused = await lists.safely(
            "sandboxes",
            session,
            tenant_id=user.tenant_id,
            filters=filters,
            sort=q.get("sort"),
            cursor=q.get("cursor"),
        )
        error = refused or error
        tenant_names = await names.tenants(session, (r.tenant_id for r in listed.rows))
    shown = [
        {
            "id": r.id,
            "tenant_id": r.tenant_id,
            "tenant_name": tenant_names.get(r.tenant_id, ""),
            "state": r.state,
            "image": r.image,
            "backend": r.backend,
            "labels": " ".join(f"{k}={v}" for k, v in sorted(r.meta.items())),
            "created_at": r.created_at.isoformat(),
        }
        for r in listed.rows
    ]
    return render(
        request,
        user,
        "sandboxes.html",
        {
            "sandboxes": shown,
            "filters": filters,
            "state": filters["state"],
            "error": error,
            **pages("/console/sandboxes", listed, lists.SANDBOX_ORDERS, q.get("cursor")),
            **context,
        },
    )


async def create(request: Request, user: User) -> Response:
    form = await request.form()
    body = {
        "image": str(form.get("image", "python")),
        "backend": str(form.get("backend", "crun")),
        "memory_mb": str(form.get("memory_mb", "512")),
        "ttl_s": str(form.get("ttl_s", "3600")),
    }
    try:
        made = await perform(api.create_sandbox, request, user, body=body)
    except CorralError as exc:
        return await list_page(request, user, error=exc.message)
    return RedirectResponse(f"/console/sandboxes/{made['id']}", status_code=303)


async def detail(request: Request, user: User, **context: Any) -> Response:
    sandbox_id = request.path_params["sandbox_id"]
    files: list[dict[str, Any]] = []
    path = request.query_params.get("path", "/home/user") or "/"
    try:
        if user.is_admin:
            async with services_of(request).sessions() as session:
                row = await session.get(Sandbox, sandbox_id)
            if row is None:
                raise NotFound(f"no sandbox {sandbox_id!r}")
            sandbox: dict[str, Any] = {
                "id": row.id,
                "tenant_id": row.tenant_id,
                "state": row.state,
                "image": row.image,
                "backend": row.backend,
                "node_id": row.node_id,
                "memory_mb": row.spec.get("memory_mb"),
                "created_at": row.created_at.isoformat(),
                "expires_at": row.expires_at.isoformat() if row.expires_at else None,
                "reason": row.reason,
            }
        else:
            sandbox = await perform(api.get_sandbox, request, user, path={"sandbox_id": sandbox_id})
            if sandbox["state"] == "running":
                try:
                    listed = await perform(
                        api.list_files,
                        request,
                        user,
                        path={"sandbox_id": sandbox_id},
                        query={"path": path},
                    )
                    files = listed["entries"]
                except CorralError as exc:
                    context.setdefault("files_error", exc.message)
    except NotFound as exc:
        return render(request, user, "error.html", {"message": exc.message}, 404)
    async with services_of(request).sessions() as session:
        metered = await metered_cpu(session, sandbox_id)
    parent = str(PurePosixPath(path).parent) if path not in ("/", "") else None
    return render(
        request,
        user,
        "sandbox.html",
        {
            "sandbox": sandbox,
            "files": files,
            "path": path,
            "parent": parent,
            "metered": metered,
            **context,
        },
    )


async def metered_cpu(session: AsyncSession, sandbox_id: str) -> list[dict[str, Any]]:
    """The CPU the sandbox used in each interval its usage was metered for (about one a
    ``sandbox_meter_seconds``, from its usage events: what is stored of its CPU over
    time), as cores on average; the newest ``METERED`` intervals, oldest first."""
    events = (
        await session.execute(
            select(UsageEvent.occurred_at, UsageEvent.instance_seconds, UsageEvent.cpu_ms)
            .where(
                UsageEvent.subject == "sandbox",
                UsageEvent.subject_id >= f"{sandbox_id}@",
                UsageEvent.subject_id < f"{sandbox_id}A",  # the ids of this one's intervals
            )
            .order_by(UsageEvent.occurred_at.desc())
            .limit(METERED)
        )
    ).all()
    return [
        {
            "end": end.strftime("%H:%M:%S"),
            "seconds": round(seconds, 1),
            "cores": round(cpu_ms / 1000 / seconds, 3) if seconds else 0.0,
        }
        for end, seconds, cpu_ms in reversed(events)
    ]


async def download(request: Request, user: User) -> Response:
    """A file of the sandbox, streamed from its node to the browser as it is read
    (``GET /v1/sandboxes/{id}/files``, as the signed-in tenant), saved under its name."""
    sandbox_id = request.path_params["sandbox_id"]
    path = request.query_params.get("path", "")
    try:
        answer: Response = await perform(
            api.read_file,
            request,
            user,
            path={"sandbox_id": sandbox_id},
            query={"path": path},
            raw=True,
        )
    except CorralError as exc:
        return render(request, user, "error.html", {"message": exc.message}, exc.status)
    name = PurePosixPath(path).name or "download"
    answer.headers["content-disposition"] = f"attachment; filename*=UTF-8''{quote(name)}"
    return answer


async def upload(request: Request, user: User) -> Response:
    """A file put into the sandbox: the request's body, streamed to the node as it
    arrives (``PUT /v1/sandboxes/{id}/files``, as the signed-in tenant, within
    ``max_file_bytes``); the CSRF token comes in ``X-CSRF-Token``, the body being the
    file. The entry written, as JSON, or the API's error."""
    try:
        written = await perform(
            api.write_file,
            request,
            user,
            path={"sandbox_id": request.path_params["sandbox_id"]},
            query={"path": request.query_params.get("path", "")},
        )
    except CorralError as exc:
        return JSONResponse(
            {"error": {"code": exc.code, "message": exc.message}}, status_code=exc.status
        )
    return JSONResponse(written)


async def live(request: Request, user: User) -> Response:
    """Server-sent events: a sandbox's state and (a tenant's) its CPU and memory, until it
    has stopped."""
    sandbox_id = request.path_params["sandbox_id"]
    sessions = services_of(request).sessions

    async def read() -> dict[str, Any]:
        if user.is_admin:
            async with sessions() as session:
                row = await session.get(Sandbox, sandbox_id)
            if row is None:
                raise NotFound(f"no sandbox {sandbox_id!r}")
            return {"state": row.state, "cpu_ms": None, "memory_bytes": None}
        got = await perform(api.get_sandbox, request, user, path={"sandbox_id": sandbox_id})
        return {k: got[k] for k in ("state", "cpu_ms", "memory_bytes")}

    try:
        first = await read()
    except NotFound as exc:
        return render(request, user, "error.html", {"message": exc.message}, 404)
    return live_updates.events(
        "sandbox", read, every_s=LIVE_EVERY_S, done=lambda f: f["state"] == "stopped", first=first
    )


async def run_command(request: Request, user: User) -> Response:
    form = await request.form()
    line = str(form.get("command", "")).strip()
    try:
        argv = shlex.split(line)
    except ValueError as exc:
        return await detail(
            request, user, error=f"the command cannot be parsed: {exc}", command=line
        )
    if not argv:
        return await detail(request, user, error="give a command", command=line)
    try:
        result = await perform(
            api.exec_command,
            request,
            user,
            path={"sandbox_id": request.path_params["sandbox_id"]},
            body={"cmd": argv, "timeout_s": 60},
        )
    except CorralError as exc:
        return await detail(request, user, error=exc.message, command=line)
    return await detail(request, user, result=result, command=line)


def action(name: str) -> Any:
    endpoints = {
        "pause": api.pause_sandbox,
        "resume": api.resume_sandbox,
        "kill": api.delete_sandbox,
    }

    async def handler(request: Request, user: User) -> Response:
        sandbox_id = request.path_params["sandbox_id"]
        try:
            await perform(endpoints[name], request, user, path={"sandbox_id": sandbox_id})
        except CorralError as exc:
            return await detail(request, user, error=exc.message)
        return RedirectResponse(f"/console/sandboxes/{sandbox_id}", status_code=303)

    return handler
