"""The gateway's client of a node's sandbox API (``node.sandboxes.http``).

A node's address comes from its catalogue report: ``host:port`` (a separate node) or
``unix:PATH`` (the node embedded in ``corral serve``); the same requests go to both. A
node serving in this same process is called directly, without its socket
(``node.agent.local``).
Node errors come back as the gateway's own (``app.errors``) with stable codes; a node
that cannot be reached is ``NodeUnavailable`` (503), never a 500.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import httpx
from pydantic import TypeAdapter

from app.errors import (
    BackendUnavailable,
    BadRequest,
    Conflict,
    CorralError,
    DiskFull,
    ImageFetchFailed,
    ImageNotFound,
    InvalidNetwork,
    InvalidPath,
    NoCapacity,
    NodeUnavailable,
    NotFound,
    PathNotFound,
    PayloadTooLarge,
    PermissionDenied,
    QuotaExceeded,
    SandboxNotRunning,
    SandboxUnresponsive,
    TooManyTransfers,
    Unsupported,
    ValidationFailed,
    WatcherQuotaExceeded,
)
from common.logsafe import loggable
from node.agent import local
from wire.processes import ProcessInfo, ProcessResize, ProcessSignal, StartProcess
from wire.sandboxes import (
    EXEC_EVENT,
    EntryPage,
    ExecEvent,
    ExecRequest,
    FileEntry,
    PtySize,
    SandboxInventory,
    SandboxSpec,
    SandboxStatus,
    SnapshotInfo,
    WatchEvents,
)

log = logging.getLogger(__name__)

_PROCESSES = TypeAdapter(list[ProcessInfo])
#: node error code -> the gateway's error
_ERRORS: dict[str, type[CorralError]] = {
    "sandbox_not_found": NotFound,
    "sandbox_not_running": SandboxNotRunning,
    "invalid_path": InvalidPath,
    "path_not_found": PathNotFound,
    "path_exists": Conflict,
    "not_a_directory": InvalidPath,
    "file_too_large": PayloadTooLarge,
    "payload_too_large": PayloadTooLarge,
    "image_not_found": ImageNotFound,
    "image_fetch_failed": ImageFetchFailed,
    "snapshot_not_found": NotFound,
    "snapshot_in_use": Conflict,
    "pause_failed": Conflict,
    "no_capacity": NoCapacity,
    "validation_error": ValidationFailed,
    "bad_request": BadRequest,
    "process_not_found": NotFound,
    "stdin_closed": BadRequest,
    "not_a_terminal": Conflict,
    "invalid_network": InvalidNetwork,
    "watcher_not_found": NotFound,
    "too_many_watchers": Conflict,
    "watcher_quota_exceeded": WatcherQuotaExceeded,
    "unsupported": Unsupported,
    "backend_unavailable": BackendUnavailable,
    "permission_denied": PermissionDenied,
    "disk_full": DiskFull,
    "too_many_transfers": TooManyTransfers,
    "sandbox_unresponsive": SandboxUnresponsive,
}
TIMEOUT = httpx.Timeout(30.0, connect=5.0)
#: bytes of a node's unexpected error message a log line keeps
NODE_MESSAGE_LOGGED = 300
#: a file call: each wait for a chunk (either way) or for the node's answer (a listing's
#: page, a tree's removal) is bounded, not the whole transfer
FILE_TIMEOUT = httpx.Timeout(90.0, connect=5.0)
#: an idle connection to a node is closed by us before the node would close it
#: (``node.agent.http.KEEP_ALIVE_S``): else a request can meet a connection closing
IDLE_CONNECTION_S = 30.0


class NodeClient:
    """One node's sandbox API."""

    def __init__(self, node_id: str, address: str, token: str) -> None:
        self.node_id = node_id
        self.address = address
        transport: httpx.AsyncBaseTransport | None = local.transport_for(address)
        if address.startswith("unix:"):
            base_url = "http://node"
            transport = transport or httpx.AsyncHTTPTransport(uds=address.removeprefix("unix:"))
        else:
            base_url = f"http://{address}"
            transport = transport or httpx.AsyncHTTPTransport()
        self._http = httpx.AsyncClient(
            transport=transport,
            limits=httpx.Limits(keepalive_expiry=IDLE_CONNECTION_S),
            base_url=base_url,
            headers={"authorization": f"Bearer {token}"},
            timeout=TIMEOUT,
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise NodeUnavailable(f"node {self.node_id} cannot be reached: {exc}") from exc
        if response.status_code >= 400:
            raise _error(response)
        return response

    async def create(self, spec: SandboxSpec) -> SandboxStatus:
        # creation can wait for an image or a slow start: no read timeout shorter than that
        response = await self._call(
            "POST", "/sandboxes", content=spec.model_dump_json(), timeout=httpx.Timeout(300.0)
        )
        return SandboxStatus.model_validate_json(response.content)

    async def inventory(self) -> SandboxInventory:
        response = await self._call("GET", "/sandboxes")
        return SandboxInventory.model_validate_json(response.content)

    async def status(self, sandbox_id: str) -> SandboxStatus:
        response = await self._call("GET", f"/sandboxes/{sandbox_id}")
        return SandboxStatus.model_validate_json(response.content)

    async def destroy(self, sandbox_id: str) -> SandboxStatus:
        response = await self._call("DELETE", f"/sandboxes/{sandbox_id}")
        return SandboxStatus.model_validate_json(response.content)

    async def action(self, sandbox_id: str, action: str, body: Any = None) -> SandboxStatus:
        response = await self._call("POST", f"/sandboxes/{sandbox_id}/{action}", json=body or {})
        return SandboxStatus.model_validate_json(response.content)

    async def exec(self, sandbox_id: str, request: ExecRequest) -> AsyncIterator[ExecEvent]:
        """The command's events as the node streams them."""
        read_s = (request.timeout_s or 86400.0) + 30.0
        path = f"/sandboxes/{sandbox_id}/exec"
        async for event in self._events("POST", path, request.model_dump_json(), read_s=read_s):
            yield event

    async def snapshot(self, sandbox_id: str, snapshot_id: str) -> SnapshotInfo:
        response = await self._call(
            "POST",
            f"/sandboxes/{sandbox_id}/snapshot",
            json={"snapshot_id": snapshot_id},
            timeout=httpx.Timeout(600.0, connect=5.0),
        )
        return SnapshotInfo.model_validate_json(response.content)

    async def delete_snapshot(self, snapshot_id: str, *, tenant_id: str) -> None:
        await self._call("DELETE", f"/snapshots/{snapshot_id}", params={"tenant_id": tenant_id})

    async def read_file(
        self, sandbox_id: str, path: str, *, user: str | None, max_bytes: int
    ) -> NodeFile:
        """Open a file the node streams; its errors (not found, permission) come here,
        before any byte."""
        params = _params(path=path, user=user, max_bytes=str(max_bytes))
        request = self._http.build_request(
            "GET", f"/sandboxes/{sandbox_id}/files", params=params, timeout=FILE_TIMEOUT
        )
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise NodeUnavailable(f"node {self.node_id} cannot be reached: {exc}") from exc
        if response.status_code >= 400:
            try:
                await response.aread()
            finally:
                await response.aclose()
            raise _error(response)
        return NodeFile(response, self.node_id)

    async def write_file(
        self,
        sandbox_id: str,
        path: str,
        data: bytes | AsyncIterable[bytes],
        *,
        user: str | None,
        mode: int | None,
    ) -> FileEntry:
        """Write a file from ``data`` (chunks are streamed to the node as they come; if
        they fail, that failure is raised, not the cut request's)."""
        params = _params(path=path, user=user, mode=None if mode is None else format(mode, "o"))
        source = _Source(data) if not isinstance(data, bytes) else None
        try:
            response = await self._call(
                "PUT",
                f"/sandboxes/{sandbox_id}/files",
                params=params,
                content=data if source is None else source,
                timeout=FILE_TIMEOUT,
            )
        except Exception:
            if source is not None and source.failure is not None:
                raise source.failure from None
            raise
        return FileEntry.model_validate_json(response.content)

    async def stat(self, sandbox_id: str, path: str, *, user: str | None = None) -> FileEntry:
        params = _params(path=path, user=user)
        response = await self._call("GET", f"/sandboxes/{sandbox_id}/fs/stat", params=params)
        return FileEntry.model_validate_json(response.content)

    async def list_dir(
        self,
        sandbox_id: str,
        path: str,
        *,
        depth: int,
        user: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> EntryPage:
        """One page of a directory's entries (the node's pages are bounded)."""
        params = _params(
            path=path,
            depth=str(depth),
            user=user,
            limit=None if limit is None else str(limit),
            cursor=cursor,
        )
        response = await self._call(
            "GET", f"/sandboxes/{sandbox_id}/fs/list", params=params, timeout=FILE_TIMEOUT
        )
        return EntryPage.model_validate_json(response.content)

    async def make_dir(self, sandbox_id: str, path: str, *, user: str | None) -> FileEntry:
        body = {"path": path, "user": user}
        response = await self._call("POST", f"/sandboxes/{sandbox_id}/fs/mkdir", json=body)
        return FileEntry.model_validate_json(response.content)

    async def remove(self, sandbox_id: str, path: str, *, user: str | None = None) -> None:
        body = {"path": path, "user": user}
        await self._call(
            "POST", f"/sandboxes/{sandbox_id}/fs/remove", json=body, timeout=FILE_TIMEOUT
        )

    async def watch(self, sandbox_id: str, path: str, *, user: str | None = None) -> str:
        """Start watching a directory (that ``user`` may read); the watcher's id."""
        body = {"path": path, "user": user}
        response = await self._call("POST", f"/sandboxes/{sandbox_id}/watchers", json=body)
        return str(response.json()["watcher_id"])

    async def watch_events(self, sandbox_id: str, watcher_id: str) -> WatchEvents:
        response = await self._call("GET", f"/sandboxes/{sandbox_id}/watchers/{watcher_id}")
        return WatchEvents.model_validate_json(response.content)

    async def unwatch(self, sandbox_id: str, watcher_id: str) -> None:
        await self._call("DELETE", f"/sandboxes/{sandbox_id}/watchers/{watcher_id}")

    async def move(
        self, sandbox_id: str, source: str, destination: str, *, user: str | None = None
    ) -> FileEntry:
        body = {"source": source, "destination": destination, "user": user}
        response = await self._call(
            "POST", f"/sandboxes/{sandbox_id}/fs/move", json=body, timeout=FILE_TIMEOUT
        )
        return FileEntry.model_validate_json(response.content)

    # --- background processes (node.sandboxes.processes) ---------------------------
    async def start_process(self, sandbox_id: str, start: StartProcess) -> AsyncIterator[ExecEvent]:
        """Start a process that outlives this stream; its events from the first."""
        path = f"/sandboxes/{sandbox_id}/processes"
        async for event in self._events("POST", path, start.model_dump_json()):
            yield event

    async def follow_process(self, sandbox_id: str, pid: int) -> AsyncIterator[ExecEvent]:
        """A running process's events from now on (``started`` first)."""
        async for event in self._events("GET", f"/sandboxes/{sandbox_id}/processes/{pid}/stream"):
            yield event

    async def processes(self, sandbox_id: str) -> list[ProcessInfo]:
        response = await self._call("GET", f"/sandboxes/{sandbox_id}/processes")
        return _PROCESSES.validate_json(response.content)

    async def signal_process(self, sandbox_id: str, pid: int, signum: int) -> None:
        body = ProcessSignal(signal=signum).model_dump_json()
        await self._call("POST", f"/sandboxes/{sandbox_id}/processes/{pid}/signal", content=body)

    async def write_stdin(self, sandbox_id: str, pid: int, data: bytes) -> None:
        await self._call("POST", f"/sandboxes/{sandbox_id}/processes/{pid}/stdin", content=data)

    async def close_stdin(self, sandbox_id: str, pid: int) -> None:
        await self._call("POST", f"/sandboxes/{sandbox_id}/processes/{pid}/close-stdin")

    async def resize(self, sandbox_id: str, pid: int, size: PtySize) -> None:
        """Resize a process's terminal (one started with ``ExecRequest.pty``)."""
        body = ProcessResize(size=size).model_dump_json()
        await self._call("POST", f"/sandboxes/{sandbox_id}/processes/{pid}/resize", content=body)

    async def _events(
        self, method: str, path: str, content: str | None = None, *, read_s: float | None = None
    ) -> AsyncIterator[ExecEvent]:
        """NDJSON events of a stream; with no ``read_s`` it may stay silent for as long as
        its process."""
        try:
            async with self._http.stream(
                method, path, content=content, timeout=httpx.Timeout(read_s, connect=5.0)
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise _error(response)
                async for line in response.aiter_lines():
                    if line:
                        yield EXEC_EVENT.validate_json(line)
        except httpx.TransportError as exc:
            raise NodeUnavailable(f"node {self.node_id} cannot be reached: {exc}") from exc


def _params(**given: str | None) -> dict[str, str]:
    return {k: v for k, v in given.items() if v is not None}


class _Source:
    """An upload's chunks; a failure while they are read (the caller went away, the body
    grew too large) is kept, to be raised instead of the request it cut."""

    def __init__(self, chunks: AsyncIterable[bytes]) -> None:
        self._chunks = chunks
        self.failure: BaseException | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._chunks:
                yield chunk
        except BaseException as exc:
            self.failure = exc
            raise


class NodeFile:
    """A file's bytes as its node streams them; ``aclose`` releases the answer (read or
    not)."""

    def __init__(self, response: httpx.Response, node_id: str) -> None:
        self._response = response
        self._node_id = node_id

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.TransportError as exc:
            raise NodeUnavailable(f"node {self._node_id} cut the file: {exc}") from exc
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        await self._response.aclose()


def _error(response: httpx.Response) -> CorralError:
    try:
        body = json.loads(response.content)
        code, message = str(body.get("error")), str(body.get("message"))
    except (ValueError, AttributeError):
        code, message = "", response.text[:200]
    kind = _ERRORS.get(code)
    if kind is None:
        # the message may quote what the tenant sent (a path, a command): escaped, bounded
        log.error(
            "node answered %s %s: %s",
            response.status_code,
            loggable(code),
            loggable(message, NODE_MESSAGE_LOGGED),
        )
        return NodeUnavailable(f"the node failed: {message}")
    if issubclass(kind, QuotaExceeded):
        retry = response.headers.get("retry-after", "1")
        return kind(message, retry_after=float(retry) if retry.isdigit() else 1.0)
    return kind(message)
