"""Who an E2B request acts as: an E2B API key is a Corral tenant API key.

The control plane gets it as ``X-API-Key`` (or ``Authorization: Bearer``). In-sandbox
calls (envd, the code interpreter) carry no API key: the SDKs send the tokens the
create (or connect) answer handed out, ``X-Access-Token`` to envd and
``E2B-Traffic-Access-Token`` to the interpreter's port. Corral hands out the caller's
own key as both, so each in-sandbox call is authenticated as that key's tenant, and the
sandbox named by ``E2b-Sandbox-Id`` must be one of that tenant's (else 404: another
tenant's sandbox is not told to exist). Revoking the key ends access to its sandboxes.
There ``Authorization`` is ``Basic <user>:`` (the user a command or file operation acts
as), never a credential.

Every E2B call, control plane or in-sandbox, takes a token of the tenant's sandbox-calls
bucket once it is authenticated (``app.sandboxes.admission``: 429 ``rate_limited``).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import Request

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


def api_key(request: Request) -> str | None:
    """The key of a control-plane request."""
    key = request.headers.get("x-api-key", "").strip()
    if key:
        return key
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


async def tenant(request: Request) -> tuple[Principal, str]:
    """A control-plane caller (charged one sandbox call): its principal and the key it
    presented."""
    key = api_key(request)
    if key is None:
        raise Unauthenticated("an API key is required (X-API-Key)")
    principal = await services(request).authenticator.tenant_for(key)
    await services(request).sandboxes.admission.call(principal)
    return principal, key


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
    key = (
        request.headers.get("x-access-token", "").strip()
        or request.headers.get("e2b-traffic-access-token", "").strip()
        or request.headers.get("x-api-key", "").strip()
    )
    if not key:
        raise Unauthenticated("an access token is required (X-Access-Token)")
    try:
        principal = await services(request).authenticator.tenant_for(key)
    except InvalidApiKey as exc:
        raise InvalidApiKey("the access token is not valid") from exc
    row = await services(request).sandboxes.place(principal.tenant_id, sandbox_id)
    await services(request).sandboxes.admission.call(principal)
    return SandboxCaller(principal, row)


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
