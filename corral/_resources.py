"""``client.tenants``, ``client.keys``, ``client.images`` and ``client.functions`` of ``Corral`` and
``AsyncCorral``: each method sends one ``_calls.Call`` and returns the API's JSON answer.

``tenants`` and ``keys`` need the admin key as the client's ``api_key``; ``functions``
a tenant's key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from corral import _build, _calls
from corral._calls import DEFAULT_WAIT_S

if TYPE_CHECKING:
    from corral._client import AsyncCorral, Corral


class Tenants:
    """``client.tenants`` (admin): create and list tenants."""

    def __init__(self, client: Corral) -> None:
        self._client = client

    def create(self, name: str, *, quota: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A new tenant and its first API key (``{"tenant": ..., "key": ...}``; the key's
        ``api_key`` is shown this once)."""
        return self._client._call(_calls.tenant_create(name, quota))

    def list(self, *, limit: int | None = None, after: str | None = None) -> dict[str, Any]:
        """One page of tenants (``{"tenants": [...], "next_after": ...}``)."""
        return self._client._call(_calls.tenant_list(limit=limit, after=after))


class Keys:
    """``client.keys`` (admin): a tenant's API keys."""

    def __init__(self, client: Corral) -> None:
        self._client = client

    def create(self, tenant_id: str, *, name: str = "") -> dict[str, Any]:
        """A new key of the tenant's (its ``api_key`` is shown this once)."""
        return self._client._call(_calls.key_create(tenant_id, name))

    def revoke(self, tenant_id: str, key_id: str) -> dict[str, Any]:
        return self._client._call(_calls.key_revoke(tenant_id, key_id))


class Images:
    """``client.images``: the images sandboxes are created from."""

    def __init__(self, client: Corral) -> None:
        self._client = client

    def list(self) -> dict[str, Any]:
        """``{"images": [...]}``: name, digest, size, what commands run as, templates."""
        return self._client._call(_calls.image_list())

    def get(self, ref: str) -> dict[str, Any]:
        """One image, by name or digest (``ImageNotFound`` if there is none)."""
        return self._client._call(_calls.image_get(ref))

    def build(
        self,
        name: str,
        *,
        dockerfile: str,
        context: _build.Context = None,
        on_log: _build.OnLog | None = None,
        network: str | Mapping[str, Any] | None = None,
        cpu: float | None = None,
        memory_mb: int | None = None,
        disk_mb: int | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Build one of the tenant's images from ``dockerfile`` (its text) in a sandbox
        of the tenant's; ``context`` (a directory, a tar archive's path or bytes) holds
        COPY's sources. ``on_log`` is called with each line of the build's log as it
        comes (``{"step": ...}``, ``{"log": ..., "stream": ...}``). Returns the image;
        a failed build raises its error (``BuildFailed``, ``QuotaExceeded``, ...)."""
        request = _build.build_request(
            name,
            dockerfile=dockerfile,
            context=context,
            network=network,
            cpu=cpu,
            memory_mb=memory_mb,
            disk_mb=disk_mb,
            timeout_s=timeout_s,
        )
        timeout = _build.read_timeout(timeout_s)
        log = _build.BuildLog(on_log)
        with self._client._stream("POST", "/v1/images", timeout=timeout, **request) as answer:
            for line in answer.iter_lines():
                log.line(line)
        return log.result()

    def delete(self, name: str) -> None:
        """Delete one of the tenant's images (``Conflict`` while a sandbox uses it)."""
        self._client._send(*_calls.image_delete(name))


class Invocations:
    """``client.invocations``: the tenant's runs and function calls, newest first."""

    def __init__(self, client: Corral) -> None:
        self._client = client

    def list(
        self,
        *,
        limit: int | None = None,
        status: str | None = None,
        kind: str | None = None,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """``{"invocations": [...], "next_cursor": ...}``; ``status`` (queued, running,
        succeeded, failed, errored) and ``kind`` (run, function) filter; pass
        ``next_cursor`` as ``cursor`` for the next page."""
        return self._client._call(
            _calls.invocation_list(limit=limit, status=status, kind=kind, cursor=cursor)
        )

    def get(self, invocation_id: str) -> dict[str, Any]:
        """One invocation and its whole result (``NotFound`` if it is not the tenant's)."""
        return self._client._call(_calls.invocation_get(invocation_id))


class Functions:
    """``client.functions``: register, list and invoke the tenant's tool functions."""

    def __init__(self, client: Corral) -> None:
        self._client = client

    def register(
        self,
        name: str,
        *,
        code: str | None = None,
        module: bytes | None = None,
        manifest: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A new version of ``name`` (``created`` is False when it is the same as the
        latest): its ``code``, or a wasm ``module``, and the rest of its manifest."""
        return self._client._call(
            _calls.function_register(name, code=code, module=module, manifest=manifest)
        )

    def list(self) -> dict[str, Any]:
        return self._client._call(_calls.function_list())

    def invoke(
        self,
        name: str,
        input: Any = None,
        *,
        version: str | None = None,
        wait_s: float | None = DEFAULT_WAIT_S,
    ) -> dict[str, Any]:
        """Invoke ``name`` (``version``: a number or an alias, else the latest) and wait
        up to ``wait_s`` for its result; a failed function is a result, not an error."""
        return self._client._call(
            _calls.function_invoke(name, input, version=version, wait_s=wait_s)
        )


class AsyncTenants:
    """``client.tenants`` of an ``AsyncCorral``."""

    def __init__(self, client: AsyncCorral) -> None:
        self._client = client

    async def create(self, name: str, *, quota: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return await self._client._call(_calls.tenant_create(name, quota))

    async def list(self, *, limit: int | None = None, after: str | None = None) -> dict[str, Any]:
        return await self._client._call(_calls.tenant_list(limit=limit, after=after))


class AsyncKeys:
    """``client.keys`` of an ``AsyncCorral``."""

    def __init__(self, client: AsyncCorral) -> None:
        self._client = client

    async def create(self, tenant_id: str, *, name: str = "") -> dict[str, Any]:
        return await self._client._call(_calls.key_create(tenant_id, name))

    async def revoke(self, tenant_id: str, key_id: str) -> dict[str, Any]:
        return await self._client._call(_calls.key_revoke(tenant_id, key_id))


class AsyncInvocations:
    """``client.invocations`` of ``AsyncCorral``."""

    def __init__(self, client: AsyncCorral) -> None:
        self._client = client

    async def list(
        self,
        *,
        limit: int | None = None,
        status: str | None = None,
        kind: str | None = None,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        return await self._client._call(
            _calls.invocation_list(limit=limit, status=status, kind=kind, cursor=cursor)
        )

    async def get(self, invocation_id: str) -> dict[str, Any]:
        return await self._client._call(_calls.invocation_get(invocation_id))


class AsyncImages:
    """``client.images`` of ``AsyncCorral``."""

    def __init__(self, client: AsyncCorral) -> None:
        self._client = client

    async def list(self) -> dict[str, Any]:
        return await self._client._call(_calls.image_list())

    async def get(self, ref: str) -> dict[str, Any]:
        return await self._client._call(_calls.image_get(ref))

    async def build(
        self,
        name: str,
        *,
        dockerfile: str,
        context: _build.Context = None,
        on_log: _build.OnLog | None = None,
        network: str | Mapping[str, Any] | None = None,
        cpu: float | None = None,
        memory_mb: int | None = None,
        disk_mb: int | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """``Images.build`` (``on_log`` is called on the event loop)."""
        request = _build.build_request(
            name,
            dockerfile=dockerfile,
            context=context,
            network=network,
            cpu=cpu,
            memory_mb=memory_mb,
            disk_mb=disk_mb,
            timeout_s=timeout_s,
        )
        timeout = _build.read_timeout(timeout_s)
        log = _build.BuildLog(on_log)
        async with self._client._stream("POST", "/v1/images", timeout=timeout, **request) as answer:
            async for line in answer.aiter_lines():
                log.line(line)
        return log.result()

    async def delete(self, name: str) -> None:
        await self._client._send(*_calls.image_delete(name))


class AsyncFunctions:
    """``client.functions`` of an ``AsyncCorral``."""

    def __init__(self, client: AsyncCorral) -> None:
        self._client = client

    async def register(
        self,
        name: str,
        *,
        code: str | None = None,
        module: bytes | None = None,
        manifest: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        return await self._client._call(
            _calls.function_register(name, code=code, module=module, manifest=manifest)
        )

    async def list(self) -> dict[str, Any]:
        return await self._client._call(_calls.function_list())

    async def invoke(
        self,
        name: str,
        input: Any = None,
        *,
        version: str | None = None,
        wait_s: float | None = DEFAULT_WAIT_S,
    ) -> dict[str, Any]:
        return await self._client._call(
            _calls.function_invoke(name, input, version=version, wait_s=wait_s)
        )
