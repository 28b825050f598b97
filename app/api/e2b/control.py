"""The E2B control plane: ``/sandboxes`` and ``/v2/sandboxes`` over Corral's records.

Every operation goes through ``app.sandboxes.service.Sandboxes`` (the tenant's records,
its ``max_concurrent_sandboxes``, placement, the node that holds the sandbox), exactly as
``/v1/sandboxes`` does; only the shapes differ. A template names a Corral image
(``app.images.catalog.TEMPLATE_IMAGES`` maps E2B's stock names to Corral's
images), ``timeout`` is the TTL,
``metadata`` and ``envVars`` pass through. A timeout (a create's, ``/timeout``,
``/refreshes``, a connect's or resume's that extends the sandbox) that would end it after
its creation plus the tenant's ``max_sandbox_lifetime_seconds`` is refused with 400, as
E2B refuses one over its plan's maximum (``app.sandboxes.lifetime``). The list filters
on ``state`` and ``metadata`` in the database (``app.sandboxes.listing``) and pages with
``nextToken``/``x-next-token``. E2B forgets a
sandbox once it is killed: a stopped record answers 404 here (it stays in
``/v1/sandboxes?state=stopped``).

The create, connect and get answers hand out a sandbox access token as
``envdAccessToken`` (and ``trafficAccessToken``): one that reaches that sandbox's
in-sandbox routes only (``app.api.e2b.tokens``), never the caller's key; the SDK sends it on
every in-sandbox call. A create, and a connect (which resumes a paused sandbox), are
refused once the tenant used its daily CPU (429 ``cpu_quota_exhausted``), as are
commands (``app.api.e2b.envd``, ``app.api.e2b.interpreter``).
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, unquote

from pydantic import ValidationError
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.api.e2b import connect
from app.api.e2b.auth import services, tenant
from app.api.e2b.errors import Handler, NotSupported, guarded, rest_error
from app.auth.principal import Principal
from app.db.cursors import decode_cursor, encode_cursor
from app.db.models import Sandbox
from app.errors import BadRequest, Conflict, NotFound, ValidationFailed
from app.images.catalog import TEMPLATE_IMAGES
from app.sandboxes import lifetime
from app.sandboxes.listing import GONE, Filters
from app.schemas.sandboxes import CreateSandbox
from wire.sandboxes import NetworkPolicy, SandboxState

log = logging.getLogger(__name__)

#: what the create answer says envd is: the features the SDK may use with it (octet-stream
#: uploads, closing stdin, the sandbox's default user; not file metadata, 0.6.2)
ENVD_VERSION = "0.5.7"
MAX_BODY_BYTES = 1 << 20
#: E2B's states, which are Corral's (a sandbox still creating is not listed)
E2B_STATES = (SandboxState.RUNNING.value, SandboxState.PAUSED.value)


def _iso(moment: datetime | None) -> str:
    moment = moment or datetime.now(UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.isoformat()


def _state(row: Sandbox) -> str:
    return "paused" if row.state == SandboxState.PAUSED.value else "running"


def _template(row: Sandbox) -> str:
    return str((row.meta or {}).get("e2b.template") or row.image)


def _metadata(row: Sandbox) -> dict[str, str]:
    return {k: str(v) for k, v in (row.meta or {}).items() if not k.startswith("e2b.")}


def access_token(request: Request, principal: Principal, row: Sandbox) -> str:
    """The sandbox's access token, good until the end of its lifetime as the tenant's
    quota sets it now (a sandbox cannot outlive that unless the quota is raised; a
    connect then hands out a token that lasts)."""
    created_at = row.created_at
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=UTC)
    ends = lifetime.deadline(created_at, principal.quota.max_sandbox_lifetime_seconds)
    return services(request).sandbox_tokens.mint(
        principal.tenant_id, row.id, expires_at=ends.timestamp()
    )


def created(row: Sandbox, token: str) -> dict[str, Any]:
    """E2B's ``Sandbox``: what a create or connect answers."""
    return {
        "templateID": _template(row),
        "sandboxID": row.id,
        "clientID": row.node_id or "corral",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": token,
        "trafficAccessToken": token,
        "domain": None,
    }


def listed(row: Sandbox) -> dict[str, Any]:
    """E2B's ``ListedSandbox``."""
    spec = row.spec or {}
    return {
        "templateID": _template(row),
        "sandboxID": row.id,
        "clientID": row.node_id or "corral",
        "startedAt": _iso(row.started_at or row.created_at),
        "endAt": _iso(row.expires_at),
        "cpuCount": max(1, round(float(spec.get("cpu", 1.0)))),
        "memoryMB": int(spec.get("memory_mb", 0)),
        "diskSizeMB": int(spec.get("disk_mb", 0)),
        "state": _state(row),
        "envdVersion": ENVD_VERSION,
        "metadata": _metadata(row),
    }


async def _body(request: Request) -> dict[str, Any]:
    return await connect.json_body(request, limit=MAX_BODY_BYTES)


def _strings(value: object, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BadRequest(f"{name} must be an object of strings")
    return dict(value)


def _timeout(value: object, default: float | None) -> float | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise BadRequest("timeout must be a positive number of seconds")
    return float(value)


async def _live(request: Request, principal: Principal, sandbox_id: str) -> Sandbox:
    """The tenant's sandbox, unless it has stopped (E2B has forgotten it then)."""
    row = await services(request).sandboxes.get(principal.tenant_id, sandbox_id)
    if row.state in GONE:
        raise NotFound(f"sandbox {sandbox_id} not found")
    return row


async def _extend(request: Request, principal: Principal, sandbox_id: str, ttl_s: float) -> Sandbox:
    """Make the sandbox last at least ``ttl_s`` from now (never shorten it); an extension
    past its lifetime quota is refused (400, as E2B refuses a timeout over the plan's)."""
    row = await _live(request, principal, sandbox_id)
    expires = row.expires_at
    if expires is not None and expires.tzinfo is None:
        expires = expires.replace(tzinfo=UTC)
    if expires is not None and expires.timestamp() >= time.time() + ttl_s:
        return row
    return await services(request).sandboxes.set_timeout(principal, sandbox_id, ttl_s)


def _states(given: list[str]) -> list[str]:
    """E2B's ``state`` filter (repeated, or comma-separated; both states by default)."""
    states = {s for value in given for s in value.split(",") if s} or set(E2B_STATES)
    unknown = states - set(E2B_STATES)
    if unknown:
        raise BadRequest(f"state must be running or paused, not {', '.join(sorted(unknown))}")
    return sorted(states)


def _wanted(params: QueryParams) -> dict[str, str]:
    """E2B's ``metadata`` filter: ``k=v&k2=v2``, each key and value URL-quoted (the SDK
    quotes them, then URL-encodes the pairs)."""
    pairs = parse_qsl(params.get("metadata", ""), keep_blank_values=True)
    wanted: dict[str, str] = {}
    for key, value in pairs:
        key, value = unquote(key), unquote(value)
        if not key or wanted.get(key, value) != value:
            raise BadRequest("metadata must be k=v pairs, each key once and not empty")
        wanted[key] = value
    return wanted


def _after(token: str | None) -> tuple[datetime, str] | None:
    """The row a ``nextToken`` (an ``x-next-token`` this API gave) continues after."""
    if token is None:
        return None
    try:
        return decode_cursor(token)
    except ValidationFailed:
        raise BadRequest("nextToken is not one this API returned") from None


def _network(internet: object, network: object) -> NetworkPolicy:
    """E2B's egress settings as a Corral allow list: ``network.allowOut`` (addresses,
    networks and host names; E2B's ``*.`` wildcards are not supported), else the whole
    internet for ``allow_internet_access: true``. Corral's default stays no network (E2B's
    is the internet): a sandbox reaches nothing that was not asked for. A ``denyOut``
    other than "everything" would need deny rules Corral does not keep per sandbox."""
    config = network if isinstance(network, dict) else {}
    allow, deny = config.get("allowOut"), config.get("denyOut")
    if allow is not None and not (
        isinstance(allow, list) and all(isinstance(a, str) for a in allow)
    ):
        raise BadRequest("network.allowOut must be a list of strings")
    if deny and not allow and deny != ["0.0.0.0/0"]:
        raise NotSupported('network.denyOut is supported only as ["0.0.0.0/0"]')
    entries = list(allow or ([] if internet is not True or deny else ["0.0.0.0/0"]))
    try:
        return NetworkPolicy(allow=entries)
    except ValidationError as exc:
        raise ValidationFailed(str(exc.errors()[0]["msg"])) from None


def routes() -> list[Route]:
    async def create(request: Request) -> Response:
        principal = await tenant(request)
        body = await _body(request)
        for field in ("volumeMounts", "mcp"):
            if body.get(field):
                raise NotSupported(f"{field} is not supported by Corral")
        template = str(body.get("templateID") or "base")
        metadata = _strings(body.get("metadata"), "metadata")
        ttl_s = _timeout(body.get("timeout"), None)
        settings = services(request).settings
        # E2B has no backend field: ``metadata={"backend": "microvm"}`` chooses Corral's
        backend = metadata.get("backend")
        try:
            create = CreateSandbox(
                **({} if backend is None else {"backend": backend}),
                image=TEMPLATE_IMAGES.get(template, template),
                memory_mb=settings.e2b_sandbox_memory_mb,
                disk_mb=settings.e2b_sandbox_disk_mb,
                env=_strings(body.get("envVars"), "envVars"),
                metadata=metadata | {"e2b.template": template},
                network=_network(body.get("allow_internet_access"), body.get("network")),
                **({} if ttl_s is None else {"ttl_s": ttl_s}),
            )
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"])
            raise ValidationFailed(f"{where}: {error['msg']}" if where else error["msg"]) from None
        row = await services(request).sandboxes.create(principal, create)
        log.info("sandbox=%s tenant=%s: created for E2B", row.id, principal.tenant_id)
        return JSONResponse(created(row, access_token(request, principal, row)), status_code=201)

    async def get(request: Request) -> Response:
        principal = await tenant(request)
        sandbox_id = request.path_params["sandbox_id"]
        row = await services(request).sandboxes.refresh(principal.tenant_id, sandbox_id)
        if row.state in GONE:
            raise NotFound(f"sandbox {sandbox_id} not found")
        return JSONResponse(
            listed(row) | {"envdAccessToken": access_token(request, principal, row)}
        )

    async def listing(request: Request) -> Response:
        principal = await tenant(request)
        params = request.query_params
        try:
            limit = min(max(int(params.get("limit", "100")), 1), 1000)
        except ValueError:
            raise BadRequest("limit must be an integer") from None
        rows = await services(request).sandboxes.list_sandboxes(
            principal.tenant_id,
            Filters(states=_states(params.getlist("state")), metadata=_wanted(params)),
            limit=limit,
            after=_after(params.get("nextToken")),
        )
        headers = {"x-next-token": encode_cursor(rows[-1])} if len(rows) == limit else {}
        return JSONResponse([listed(row) for row in rows], headers=headers)

    async def kill(request: Request) -> Response:
        principal = await tenant(request)
        sandbox_id = request.path_params["sandbox_id"]
        await _live(request, principal, sandbox_id)
        await services(request).sandboxes.destroy(principal.tenant_id, sandbox_id)
        log.info("sandbox=%s: killed through E2B", sandbox_id)
        return Response(status_code=204)

    async def set_timeout(request: Request) -> Response:
        principal = await tenant(request)
        sandbox_id = request.path_params["sandbox_id"]
        ttl_s = _timeout((await _body(request)).get("timeout"), None)
        if ttl_s is None:
            raise BadRequest("timeout is required")
        await _live(request, principal, sandbox_id)
        await services(request).sandboxes.set_timeout(principal, sandbox_id, ttl_s)
        return Response(status_code=204)

    async def refresh(request: Request) -> Response:
        principal = await tenant(request)
        sandbox_id = request.path_params["sandbox_id"]
        ttl_s = _timeout((await _body(request)).get("duration"), 60.0) or 60.0
        await _extend(request, principal, sandbox_id, ttl_s)
        return Response(status_code=204)

    async def pause(request: Request) -> Response:
        principal = await tenant(request)
        sandbox_id = request.path_params["sandbox_id"]
        row = await _live(request, principal, sandbox_id)
        if row.state == SandboxState.PAUSED.value:
            raise Conflict(f"sandbox {sandbox_id} is already paused")
        await services(request).sandboxes.action(principal, sandbox_id, "pause")
        return Response(status_code=204)

    async def connect(request: Request) -> Response:
        principal = await tenant(request)
        sandbox_id = request.path_params["sandbox_id"]
        body = await _body(request)
        ttl_s = _timeout(body.get("timeout"), None)
        row = await _live(request, principal, sandbox_id)
        await services(request).sandboxes.admission.cpu(principal)
        if ttl_s is not None:  # first: a refused extension leaves a paused sandbox paused
            row = await _extend(request, principal, sandbox_id, ttl_s)
        status = 200
        if row.state == SandboxState.PAUSED.value:
            row = await services(request).sandboxes.action(principal, sandbox_id, "resume")
            status = 201
        token = access_token(request, principal, row)
        return JSONResponse(created(row, token), status_code=status)

    async def resume(request: Request) -> Response:
        principal = await tenant(request)
        sandbox_id = request.path_params["sandbox_id"]
        ttl_s = _timeout((await _body(request)).get("timeout"), None)
        row = await _live(request, principal, sandbox_id)
        if row.state != SandboxState.PAUSED.value:
            raise Conflict(f"sandbox {sandbox_id} is not paused")
        await services(request).sandboxes.admission.cpu(principal)
        if ttl_s is not None:
            await _extend(request, principal, sandbox_id, ttl_s)
        row = await services(request).sandboxes.action(principal, sandbox_id, "resume")
        return JSONResponse(created(row, access_token(request, principal, row)), status_code=201)

    async def metrics(request: Request) -> Response:
        principal = await tenant(request)
        sandbox_id = request.path_params["sandbox_id"]
        row = await services(request).sandboxes.refresh(principal.tenant_id, sandbox_id)
        if row.state in GONE:
            raise NotFound(f"sandbox {sandbox_id} not found")
        spec = row.spec or {}
        now = datetime.now(UTC)
        sample = {
            "timestamp": now.isoformat(),
            "timestampUnix": int(now.timestamp()),
            "cpuCount": max(1, round(float(spec.get("cpu", 1.0)))),
            "cpuUsedPct": 0.0,
            "memUsed": row.memory_bytes or 0,
            "memTotal": int(spec.get("memory_mb", 0)) << 20,
            "memCache": 0,
            "diskUsed": 0,
            "diskTotal": int(spec.get("disk_mb", 0)) << 20,
        }
        return JSONResponse([sample])

    one = "/sandboxes/{sandbox_id}"
    table: list[tuple[str, Handler, list[str]]] = [
        ("/sandboxes", create, ["POST"]),
        ("/v2/sandboxes", create, ["POST"]),
        ("/sandboxes", listing, ["GET"]),
        ("/v2/sandboxes", listing, ["GET"]),
        (one, get, ["GET"]),
        (one, kill, ["DELETE"]),
        (f"{one}/timeout", set_timeout, ["POST"]),
        (f"{one}/refreshes", refresh, ["POST"]),
        (f"{one}/pause", pause, ["POST"]),
        (f"{one}/resume", resume, ["POST"]),
        (f"{one}/connect", connect, ["POST"]),
        (f"/v2{one}/connect", connect, ["POST"]),
        (f"{one}/metrics", metrics, ["GET"]),
    ]
    return [
        Route(path, guarded(handler, rest_error), methods=methods)
        for path, handler, methods in table
    ]
