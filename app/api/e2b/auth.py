"""Who an E2B request acts as.

The control plane gets a tenant's API key (an E2B API key is a Corral tenant API key) as
``X-API-Key`` (or ``Authorization: Bearer``; both, different: 400
``conflicting_credentials``; every header is read by ``app.auth.credentials``).
In-sandbox calls (envd, ``/files``, ``/health``, the code interpreter) carry the tokens
the create, connect or get answer handed out: ``X-Access-Token`` to envd,
``E2B-Traffic-Access-Token`` to the interpreter's port (two different ones: 400). Those
are sandbox access tokens (``app.api.e2b.tokens``): each reaches only the sandbox it names,
which ``E2b-Sandbox-Id`` must name too, while that sandbox lives; it is never accepted
on the control plane, ``/v1`` or another sandbox. A token of a tenant since disabled is
refused. An in-sandbox call may instead carry the tenant's API key in one of those
headers (or ``X-API-Key``): it reaches every sandbox of that tenant, as the key does
anyway, and another tenant's sandbox answers 404 (it is not told to exist). There
``Authorization`` is ``Basic <user>:`` (the user a command or file operation acts as),
never a credential.

Every E2B call, control plane or in-sandbox, takes a token of the tenant's sandbox-calls
bucket once it is authenticated (``app.sandboxes.admission``: 429 ``rate_limited``).
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import Request

from app.api.e2b import tokens
from app.auth import credentials
from app.auth.principal import Principal
from app.errors import InvalidApiKey, NotFound, Unauthenticated
from app.sandboxes.place import SandboxPlace

if TYPE_CHECKING:
    from app.services import Services

SANDBOX_HEADER = "e2b-sandbox-id"
PORT_HEADER = "e2b-sandbox-port"
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


def services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


async def tenant(request: Request) -> Principal:
    """A control-plane caller (charged one sandbox call)."""
    key = credentials.presented(request, credentials.E2B_CONTROL)
    if key is None:
        raise Unauthenticated("an API key is required (X-API-Key)")
    principal = await services(request).authenticator.tenant_for(key)
    await services(request).sandboxes.admission.call(principal)
    return principal


@dataclass(frozen=True, slots=True)
class SandboxCaller:
    principal: Principal
    row: SandboxPlace

    @property
    def sandbox_id(self) -> str:
        return self.row.id


async def sandbox_caller(request: Request) -> SandboxCaller:
    """An in-sandbox caller and the (live or not) record of its sandbox (charged one
    sandbox call)."""
    sandbox_id = request.headers.get(SANDBOX_HEADER, "").strip()
    if not sandbox_id:
        raise NotFound("no E2b-Sandbox-Id header: which sandbox?")
    presented = credentials.presented(request, credentials.E2B_SANDBOX)
    if not presented:
        raise Unauthenticated("an access token is required (X-Access-Token)")
    if tokens.is_token(presented):
        principal, row = await _by_token(request, presented, sandbox_id)
    else:
        try:
            principal = await services(request).authenticator.tenant_for(presented)
        except InvalidApiKey as exc:
            raise InvalidApiKey("the access token is not valid") from exc
        row = await services(request).sandboxes.place(principal.tenant_id, sandbox_id)
    await services(request).sandboxes.admission.call(principal)
    return SandboxCaller(principal, row)


async def _by_token(
    request: Request, presented: str, sandbox_id: str
) -> tuple[Principal, SandboxPlace]:
    """The tenant and record of the sandbox a sandbox access token reaches: the one
    ``E2b-Sandbox-Id`` names, and only if the token was made for it and has not expired
    (every refusal is the same 401: nothing is told of other sandboxes)."""
    refused = InvalidApiKey("the access token is not valid for this sandbox")
    claim = tokens.SandboxTokens.claim(presented)
    if claim is None or claim.sandbox_id != sandbox_id:
        raise refused
    row = await services(request).sandboxes.place_of(sandbox_id)
    if row is None:
        raise refused
    minted = services(request).sandbox_tokens
    if not minted.valid(claim, tenant_id=row.tenant_id, now=time.time()):
        raise refused
    return await services(request).authenticator.tenant_principal(row.tenant_id), row


def run_as(request: Request) -> str | None:
    """The user named by ``Authorization: Basic <user>:`` (None: the sandbox's default)."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic" or not value.strip():
        return None
    try:
        user = base64.b64decode(value.strip(), validate=True).decode().partition(":")[0]
    except (binascii.Error, UnicodeDecodeError):
        return None
    return user if _USER.fullmatch(user) else None


def home_of(user: str | None, default_user: str) -> str:
    """Where a relative path of ``user`` starts (E2B resolves them from the home)."""
    name = user or default_user
    return "/root" if name == "root" else f"/home/{name}"
