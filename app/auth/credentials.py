"""The one reader of the credential a request presents, for every surface.

Each surface names the headers it reads a credential from (``Surface``): the API and
E2B's control plane ``Authorization: Bearer`` and ``X-API-Key``; E2B's in-sandbox calls
``X-Access-Token``, ``E2B-Traffic-Access-Token`` and ``X-API-Key`` (there
``Authorization`` is ``Basic <user>:``, the user a call acts as, never a credential); the
node-facing routes ``Authorization: Bearer`` only. ``presented`` reads them in one pass
over the raw headers.

There is no precedence to get wrong: a request whose accepted headers carry two
different credentials (``X-API-Key: A`` with ``Authorization: Bearer B``, or two
``Authorization`` headers that differ) is refused with 400 ``conflicting_credentials``
on every surface, instead of one surface picking A and another B. The same credential
in several headers is one credential. An empty header counts as absent; an
``Authorization`` that a surface reads but that is not ``Bearer <credential>`` is 401
``invalid_api_key``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import HTTPConnection

from app.errors import ConflictingCredentials, InvalidApiKey

AUTHORIZATION = "authorization"


@dataclass(frozen=True, slots=True)
class Surface:
    """Where one surface looks for a credential (lower-case header names;
    ``authorization`` is read as ``Bearer <credential>``)."""

    name: str
    headers: tuple[str, ...]
    raw: frozenset[bytes] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "raw", frozenset(h.encode("latin-1") for h in self.headers))


#: ``/v1``, the console's API calls, SandboxFusion's ``/run_code``.
API = Surface("api", (AUTHORIZATION, "x-api-key"))
#: E2B's control plane (``/sandboxes``): an E2B API key is a Corral tenant key.
E2B_CONTROL = Surface("e2b", (AUTHORIZATION, "x-api-key"))
#: E2B's in-sandbox calls (envd, the interpreter): a sandbox access token or a tenant key.
E2B_SANDBOX = Surface("e2b-sandbox", ("x-access-token", "e2b-traffic-access-token", "x-api-key"))
#: The node-facing routes (``/internal/``): the node token.
NODE = Surface("node", (AUTHORIZATION,))


def presented(request: HTTPConnection, surface: Surface) -> str | None:
    """The credential ``request`` (or a WebSocket) presents on ``surface``, or None; raises
    ``ConflictingCredentials`` when its headers carry two different ones."""
    accepted = surface.raw
    found: str | None = None
    where = ""
    name: bytes
    value: bytes
    for name, value in request.scope["headers"]:
        if name not in accepted:
            continue
        text = value.decode("latin-1").strip()
        if name == b"authorization":
            if not text:
                continue
            scheme, _, credential = text.partition(" ")
            credential = credential.strip()
            if scheme.lower() != "bearer" or not credential:
                raise InvalidApiKey("Authorization must be 'Bearer <api key>'")
            text = credential
        if not text:
            continue
        header = name.decode("latin-1")
        if found is None:
            found, where = text, header
        elif text != found:
            raise ConflictingCredentials(
                f"the request carries two different credentials ({where} and {header}): send one",
                details={"headers": sorted({where, header})},
            )
    return found
