"""``Corral`` and ``AsyncCorral``: a connection to a Corral server: its sandboxes, one-shot
runs, tool functions, usage, and (with the admin key) tenants and keys.

Both read ``CORRAL_URL`` and ``CORRAL_API_KEY`` when they are made (not at import) unless
given ``url`` and ``api_key``. Every failure is a ``corral.CorralError``; httpx's own
exceptions are converted here, at the seam.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from types import TracebackType
from typing import Any

import httpx

from corral import _calls
from corral._api import (
    DEFAULT_TIMEOUT,
    create_body,
    headers,
    json_object,
    one,
    resolve_key,
    resolve_url,
)
from corral._calls import DEFAULT_WAIT_S, Call
from corral._errors import connection_error, error_from_response
from corral._models import SandboxInfo
from corral._resources import (
    AsyncFunctions,
    AsyncImages,
    AsyncInvocations,
    AsyncKeys,
    AsyncTenants,
    Functions,
    Images,
    Invocations,
    Keys,
    Tenants,
)
from corral._sandbox import AsyncSandbox, Sandbox

SANDBOXES = "/v1/sandboxes"


class Corral:
    """A synchronous client: ``Corral().sandboxes.create()``.

    ``timeout`` bounds each request (seconds); an exec waits for its command's own
    ``timeout_s`` on top. Close it (or use it as a context manager) to free its pool.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = resolve_url(url)
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=self.url,
            headers=headers(resolve_key(api_key)),
            timeout=timeout,
            transport=transport,
        )
        self.sandboxes = Sandboxes(self)
        self.functions = Functions(self)
        self.images = Images(self)
        self.invocations = Invocations(self)
        self.tenants = Tenants(self)
        self.keys = Keys(self)

    def run(
        self,
        language: str,
        code: str,
        *,
        stdin: str | None = None,
        run_timeout: float | None = None,
        memory_limit_mb: int | None = None,
        wait_s: float | None = DEFAULT_WAIT_S,
    ) -> dict[str, Any]:
        """Run ``code`` once (``POST /v1/run``) and return its result; a program that
        fails is a result (``status``), not an error. ``wait_s`` bounds the wait."""
        return self._call(
            _calls.run(
                language,
                code,
                stdin=stdin,
                run_timeout=run_timeout,
                memory_limit_mb=memory_limit_mb,
                wait_s=wait_s,
            )
        )

    def usage(
        self,
        *,
        group_by: str | None = None,
        start: str | None = None,
        end: str | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """Use and cost over a time range (ISO 8601), grouped (``GET /v1/usage``): a
        tenant's own with its key, anyone's (``tenant``) with the admin key."""
        return self._call(_calls.usage(group_by=group_by, start=start, end=end, tenant=tenant))

    def usage_csv(
        self,
        *,
        group_by: str | None = None,
        start: str | None = None,
        end: str | None = None,
        tenant: str | None = None,
    ) -> str:
        """The same report as CSV: one row per group, then a total row."""
        call = _calls.usage(group_by=group_by, start=start, end=end, tenant=tenant, csv=True)
        return self._send_call(call).text

    def _call(self, call: Call) -> dict[str, Any]:
        return json_object(self._send_call(call))

    def _send_call(self, call: Call) -> httpx.Response:
        timeout = httpx.Timeout(self.timeout, read=call.read_s) if call.read_s else None
        return self._send(call.method, call.path, timeout=timeout, **call.request_kwargs())

    def _send(
        self,
        method: str,
        path: str,
        *,
        stream: bool = False,
        timeout: httpx.Timeout | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """Send one request; an error answer raises its ``CorralError``."""
        request = self._http.build_request(method, path, **kwargs)
        if timeout is not None:
            request.extensions["timeout"] = timeout.as_dict()
        try:
            response = self._http.send(request, stream=stream)
            if response.status_code >= 400 and stream:
                try:
                    response.read()
                finally:
                    response.close()
        except httpx.HTTPError as exc:
            raise connection_error(exc, self.url) from exc
        if response.status_code >= 400:
            raise error_from_response(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        return json_object(self._send(method, path, **kwargs))

    @contextmanager
    def _stream(self, method: str, path: str, **kwargs: Any) -> Iterator[httpx.Response]:
        """A streamed answer; a transport failure while it is read is converted too."""
        response = self._send(method, path, stream=True, **kwargs)
        try:
            yield response
        except httpx.HTTPError as exc:
            raise connection_error(exc, self.url) from exc
        finally:
            response.close()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Corral:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Corral(url={self.url!r})"


class Sandboxes:
    """``client.sandboxes``: create, find and list the tenant's sandboxes."""

    def __init__(self, client: Corral) -> None:
        self._client = client

    def create(
        self,
        image: str = "python",
        *,
        backend: str | None = None,
        cpu: float | None = None,
        memory_mb: int | None = None,
        disk_mb: int | None = None,
        ttl_s: float | None = None,
        idle_timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        user: str | None = None,
        network: Sequence[str] | None = None,
    ) -> Sandbox:
        """A new running sandbox; what is not given takes the server's default."""
        body = create_body(
            image=image,
            backend=backend,
            cpu=cpu,
            memory_mb=memory_mb,
            disk_mb=disk_mb,
            ttl_s=ttl_s,
            idle_timeout_s=idle_timeout_s,
            env=env,
            metadata=metadata,
            user=user,
            network=network,
        )
        info = SandboxInfo.from_json(self._client._json("POST", SANDBOXES, json=body))
        return Sandbox(self._client, info)

    def get(self, sandbox_id: str) -> Sandbox:
        """A sandbox of the tenant's (a stopped one too), with its readings now."""
        return Sandbox(
            self._client, SandboxInfo.from_json(self._client._json("GET", one(sandbox_id)))
        )

    def list(self, state: str = "live", *, limit: int = 100) -> builtins.list[Sandbox]:
        """The tenant's sandboxes: ``live`` (creating, running or paused) or one state."""
        body = self._client._json("GET", SANDBOXES, params={"state": state, "limit": limit})
        return [Sandbox(self._client, SandboxInfo.from_json(s)) for s in body["sandboxes"]]


class AsyncCorral:
    """The asynchronous twin of ``Corral``: ``await AsyncCorral().sandboxes.create()``."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = resolve_url(url)
        self.timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=headers(resolve_key(api_key)),
            timeout=timeout,
            transport=transport,
        )
        self.sandboxes = AsyncSandboxes(self)
        self.functions = AsyncFunctions(self)
        self.images = AsyncImages(self)
        self.invocations = AsyncInvocations(self)
        self.tenants = AsyncTenants(self)
        self.keys = AsyncKeys(self)

    async def run(
        self,
        language: str,
        code: str,
        *,
        stdin: str | None = None,
        run_timeout: float | None = None,
        memory_limit_mb: int | None = None,
        wait_s: float | None = DEFAULT_WAIT_S,
    ) -> dict[str, Any]:
        return await self._call(
            _calls.run(
                language,
                code,
                stdin=stdin,
                run_timeout=run_timeout,
                memory_limit_mb=memory_limit_mb,
                wait_s=wait_s,
            )
        )

    async def usage(
        self,
        *,
        group_by: str | None = None,
        start: str | None = None,
        end: str | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        return await self._call(
            _calls.usage(group_by=group_by, start=start, end=end, tenant=tenant)
        )

    async def usage_csv(
        self,
        *,
        group_by: str | None = None,
        start: str | None = None,
        end: str | None = None,
        tenant: str | None = None,
    ) -> str:
        call = _calls.usage(group_by=group_by, start=start, end=end, tenant=tenant, csv=True)
        return (await self._send_call(call)).text

    async def _call(self, call: Call) -> dict[str, Any]:
        return json_object(await self._send_call(call))

    async def _send_call(self, call: Call) -> httpx.Response:
        timeout = httpx.Timeout(self.timeout, read=call.read_s) if call.read_s else None
        return await self._send(call.method, call.path, timeout=timeout, **call.request_kwargs())

    async def _send(
        self,
        method: str,
        path: str,
        *,
        stream: bool = False,
        timeout: httpx.Timeout | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        request = self._http.build_request(method, path, **kwargs)
        if timeout is not None:
            request.extensions["timeout"] = timeout.as_dict()
        try:
            response = await self._http.send(request, stream=stream)
            if response.status_code >= 400 and stream:
                try:
                    await response.aread()
                finally:
                    await response.aclose()
        except httpx.HTTPError as exc:
            raise connection_error(exc, self.url) from exc
        if response.status_code >= 400:
            raise error_from_response(response)
        return response

    async def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        return json_object(await self._send(method, path, **kwargs))

    @asynccontextmanager
    async def _stream(self, method: str, path: str, **kwargs: Any) -> AsyncIterator[httpx.Response]:
        response = await self._send(method, path, stream=True, **kwargs)
        try:
            yield response
        except httpx.HTTPError as exc:
            raise connection_error(exc, self.url) from exc
        finally:
            await response.aclose()

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncCorral:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncCorral(url={self.url!r})"


class AsyncSandboxes:
    """``client.sandboxes`` of an ``AsyncCorral``."""

    def __init__(self, client: AsyncCorral) -> None:
        self._client = client

    async def create(
        self,
        image: str = "python",
        *,
        backend: str | None = None,
        cpu: float | None = None,
        memory_mb: int | None = None,
        disk_mb: int | None = None,
        ttl_s: float | None = None,
        idle_timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        user: str | None = None,
        network: Sequence[str] | None = None,
    ) -> AsyncSandbox:
        body = create_body(
            image=image,
            backend=backend,
            cpu=cpu,
            memory_mb=memory_mb,
            disk_mb=disk_mb,
            ttl_s=ttl_s,
            idle_timeout_s=idle_timeout_s,
            env=env,
            metadata=metadata,
            user=user,
            network=network,
        )
        info = SandboxInfo.from_json(await self._client._json("POST", SANDBOXES, json=body))
        return AsyncSandbox(self._client, info)

    async def get(self, sandbox_id: str) -> AsyncSandbox:
        info = SandboxInfo.from_json(await self._client._json("GET", one(sandbox_id)))
        return AsyncSandbox(self._client, info)

    async def list(self, state: str = "live", *, limit: int = 100) -> builtins.list[AsyncSandbox]:
        body = await self._client._json("GET", SANDBOXES, params={"state": state, "limit": limit})
        return [AsyncSandbox(self._client, SandboxInfo.from_json(s)) for s in body["sandboxes"]]
