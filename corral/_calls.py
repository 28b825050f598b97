"""What the SDK's calls outside sandboxes send: tenants and keys (with the admin key),
usage, one-shot runs and tool functions.

No I/O here: each function says which request to make (``Call``); the clients send it
and hand back the API's JSON answer as it came (a ``dict``), so a field the server adds
later reaches the caller unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from corral._api import drop_none

#: how long a run or an invocation may take to answer by default (it may queue first)
DEFAULT_WAIT_S = 3600.0


@dataclass(frozen=True)
class Call:
    """One request: ``read_s`` overrides the client's read timeout; ``text`` means the
    answer is text (CSV), not a JSON object."""

    method: str
    path: str
    json: Any = None
    params: dict[str, Any] | None = None
    read_s: float | None = None
    text: bool = False

    def request_kwargs(self) -> dict[str, Any]:
        return drop_none(json=self.json, params=self.params)


def _seg(value: str) -> str:
    return quote(value, safe="")


def tenant_create(name: str, quota: Mapping[str, Any] | None) -> Call:
    return Call("POST", "/v1/tenants", json={"name": name, "quota": dict(quota or {})})


def tenant_list(*, limit: int | None, after: str | None) -> Call:
    return Call("GET", "/v1/tenants", params=drop_none(limit=limit, after=after) or None)


def key_create(tenant_id: str, name: str) -> Call:
    return Call("POST", f"/v1/tenants/{_seg(tenant_id)}/keys", json={"name": name})


def key_revoke(tenant_id: str, key_id: str) -> Call:
    return Call("DELETE", f"/v1/tenants/{_seg(tenant_id)}/keys/{_seg(key_id)}")


def usage(
    *,
    group_by: str | None,
    start: str | None,
    end: str | None,
    tenant: str | None,
    csv: bool = False,
) -> Call:
    params = drop_none(group_by=group_by, start=start, end=end, tenant=tenant)
    if csv:
        params["format"] = "csv"
    return Call("GET", "/v1/usage", params=params, text=csv)


def run(
    language: str,
    code: str,
    *,
    stdin: str | None,
    run_timeout: float | None,
    memory_limit_mb: int | None,
    wait_s: float | None,
) -> Call:
    body = {"language": language, "code": code} | drop_none(
        run_timeout=run_timeout, stdin=stdin, memory_limit_mb=memory_limit_mb
    )
    return Call("POST", "/v1/run", json=body, read_s=wait_s)


def function_register(
    name: str,
    *,
    code: str | None,
    module: bytes | None,
    manifest: Mapping[str, Any] | None,
) -> Call:
    """A new version of function ``name``: its source (``code``) or a wasm ``module``,
    and the rest of its manifest (``language``, ``entry_point``, ``input_schema``,
    ``limits``)."""
    import base64

    if (code is None) == (module is None):
        raise ValueError("give exactly one of code and module")
    body: dict[str, Any] = {**(manifest or {}), "name": name}
    if code is not None:
        body["code"] = code
    else:
        assert module is not None
        body["module_base64"] = base64.b64encode(module).decode("ascii")
    return Call("POST", "/v1/functions", json=body)


def image_list() -> Call:
    return Call("GET", "/v1/images")


def image_get(ref: str) -> Call:
    return Call("GET", f"/v1/images/{_seg(ref)}")


def invocation_list(
    *, limit: int | None, status: str | None, kind: str | None, cursor: str | None
) -> Call:
    params = drop_none(limit=limit, status=status, kind=kind, cursor=cursor)
    return Call("GET", "/v1/invocations", params=params or None)


def invocation_get(invocation_id: str) -> Call:
    return Call("GET", f"/v1/invocations/{_seg(invocation_id)}")


def image_delete(name: str) -> tuple[str, str]:
    return "DELETE", f"/v1/images/{_seg(name)}"


def function_list() -> Call:
    return Call("GET", "/v1/functions")


def function_invoke(name: str, value: Any, *, version: str | None, wait_s: float | None) -> Call:
    path = f"/v1/functions/{_seg(name)}/invoke"
    if version is not None:
        path = f"/v1/functions/{_seg(name)}/versions/{_seg(version)}/invoke"
    return Call("POST", path, json=value, read_s=wait_s)
