"""The node's sandbox API: what a gateway calls on the node that holds a sandbox.

Served by the node's own listener beside ``/healthz`` (``node.agent.http``), every
route needs ``Authorization: Bearer <node token>`` (the token gateways and nodes share;
compared in constant time). Bodies are ``wire.sandboxes`` models; errors are
``{"error": code, "message": ...}`` with the ``SandboxError``'s status. ``exec`` answers
NDJSON: one ``ExecEvent`` per line as it happens, the ``exit`` event last. File calls act
as ``user`` (default: the sandbox's user; ``SandboxBackend`` says what that means); file
bytes stream both ways in bounded chunks; downloads, uploads and listing pages count
against the node's transfer bounds (``node.sandboxes.transfers``).

    POST   /sandboxes                       SandboxSpec -> SandboxStatus
    GET    /sandboxes                       -> SandboxInventory
    GET    /sandboxes/{id}                  -> SandboxStatus
    DELETE /sandboxes/{id}                  -> SandboxStatus
    POST   /sandboxes/{id}/pause|resume     -> SandboxStatus
    POST   /sandboxes/{id}/timeout          {"ttl_s"} -> SandboxStatus
    POST   /sandboxes/{id}/exec             ExecRequest -> NDJSON ExecEvents
    GET    /sandboxes/{id}/files?path=&user=&max_bytes=   -> the bytes, streamed
    PUT    /sandboxes/{id}/files?path=&user=&mode=   bytes (streamed) -> FileEntry
    GET    /sandboxes/{id}/fs/stat?path=&user=       -> FileEntry
    GET    /sandboxes/{id}/fs/list?path=&user=&depth=&limit=&cursor=   -> EntryPage
    POST   /sandboxes/{id}/fs/mkdir         {"path", "user"} -> FileEntry
    POST   /sandboxes/{id}/fs/remove        {"path", "user"}
    POST   /sandboxes/{id}/fs/move          {"source", "destination", "user"} -> FileEntry
    POST   /sandboxes/{id}/snapshot         {"snapshot_id"} -> SnapshotInfo
    GET    /snapshots                       -> [SnapshotInfo]
    DELETE /snapshots/{snapshot_id}?tenant_id=
    ...    /sandboxes/{id}/processes...     background processes (node.sandboxes.processes)
"""

from __future__ import annotations

import errno
import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from node.sandboxes import rooted
from node.sandboxes.base import FileStream, SandboxError
from node.sandboxes.manager import SandboxManager
from node.sandboxes.processes import ProcessTable, process_routes
from node.sandboxes.transfers import Slot, TransferSlots
from node.sandboxes.watch import WatcherTable, WatchLimits, watcher_routes
from wire.sandboxes import MAX_FILE_BYTES, MAX_PAGE, ExecRequest, SandboxInventory, SandboxSpec

log = logging.getLogger(__name__)

MAX_SPEC_BYTES = 1 << 20
#: errors of a node out of resources (descriptors, inotify watches, memory): 503
_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.ENOMEM}

Handler = Callable[[Request], Awaitable[Response]]


def _json(model: BaseModel | list[Any] | dict[str, Any], status: int = 200) -> Response:
    if isinstance(model, BaseModel):
        return Response(model.model_dump_json(), status_code=status, media_type="application/json")
    body = (
        [m.model_dump(mode="json") if isinstance(m, BaseModel) else m for m in model]
        if (isinstance(model, list))
        else model
    )
    return JSONResponse(body, status_code=status)


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": code, "message": message}, status_code=status, headers=headers)


async def _body(request: Request, limit: int = MAX_SPEC_BYTES) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise SandboxBodyTooLarge(f"the body is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class SandboxBodyTooLarge(SandboxError):
    status, code = 413, "payload_too_large"


async def _bounded(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """``chunks``, refused (``SandboxBodyTooLarge``) once they pass ``limit`` bytes."""
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise SandboxBodyTooLarge(f"the body is over {limit} bytes")
        if chunk:
            yield chunk


class _FileResponse(StreamingResponse):
    """A file's bytes as they are read; the stream and its transfer slot are released when
    the answer ends, however it ends (sent, cut, or never started)."""

    def __init__(self, stream: FileStream, slot: Slot) -> None:
        super().__init__(stream.chunks(), media_type="application/octet-stream")
        self._stream = stream
        self._slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._stream.close()
            finally:
                self._slot.release()


def sandbox_routes(
    manager: SandboxManager,
    token: str,
    *,
    node_id: str,
    transfers: TransferSlots | None = None,
    watch_limits: WatchLimits | None = None,
) -> list[Route]:
    expected = f"Bearer {token}".encode()
    slots = transfers or TransferSlots()

    def guarded(handler: Handler) -> Handler:
        async def run(request: Request) -> Response:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return _error(401, "invalid_node_token", "this API needs the node token")
            try:
                return await handler(request)
            except SandboxError as exc:
                return _error(exc.status, exc.code, str(exc), exc.headers())
            except ValidationError as exc:
                detail = "; ".join(
                    f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
                )
                return _error(422, "validation_error", detail)
            except (ValueError, KeyError) as exc:
                return _error(400, "bad_request", str(exc))
            except OSError as exc:
                if exc.errno not in _EXHAUSTED:
                    raise
                # the node is out of descriptors, inotify watches or memory: a clear
                # answer, one line in the log (rate-limited), no traceback per call
                log.warning("%s %s refused: %s", request.method, request.url.path, exc)
                return _error(503, "no_capacity", "the node is out of resources; retry")

        return run

    def sid(request: Request) -> str:
        return str(request.path_params["sandbox_id"])

    def path_of(request: Request, home: str = "/") -> str:
        return rooted.normalise(request.query_params.get("path", ""), home=home)

    async def create(request: Request) -> Response:
        spec = SandboxSpec.model_validate_json(await _body(request))
        return _json(await manager.create(spec), 201)

    async def inventory(request: Request) -> Response:
        return _json(SandboxInventory(node_id=node_id, sandboxes=manager.inventory()))

    async def get(request: Request) -> Response:
        return _json(await manager.status(sid(request)))

    async def delete(request: Request) -> Response:
        return _json(await manager.destroy(sid(request)))

    async def pause(request: Request) -> Response:
        return _json(await manager.pause(sid(request)))

    async def resume(request: Request) -> Response:
        return _json(await manager.resume(sid(request)))

    async def timeout(request: Request) -> Response:
        body = json.loads(await _body(request))
        ttl_s = float(body["ttl_s"])
        if not 0 < ttl_s <= 30 * 86400:
            raise ValueError("ttl_s must be within (0, 30 days]")
        return _json(await manager.set_timeout(sid(request), ttl_s))

    async def exec_(request: Request) -> Response:
        exec_request = ExecRequest.model_validate_json(await _body(request))
        process = await manager.exec(sid(request), exec_request)

        async def lines() -> AsyncIterator[bytes]:
            async for event in process.events():
                yield event.model_dump_json().encode() + b"\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    def user_of(request: Request, spec: SandboxSpec, given: object = None) -> str:
        named = given if given is not None else request.query_params.get("user")
        if named is not None and not isinstance(named, str):
            raise ValueError("user must be a string")
        return named or spec.user

    async def read_file(request: Request) -> Response:
        backend, spec = manager.backend_of(sid(request))
        limit = min(int(request.query_params.get("max_bytes", MAX_FILE_BYTES)), MAX_FILE_BYTES)
        user, path = user_of(request, spec), path_of(request)
        slot = slots.take(spec.tenant_id)
        try:
            stream = await backend.read_file(sid(request), path, user=user, max_bytes=limit)
        except BaseException:
            slot.release()
            raise
        return _FileResponse(stream, slot)

    async def write_file(request: Request) -> Response:
        backend, spec = manager.backend_of(sid(request))
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_FILE_BYTES:
            raise SandboxBodyTooLarge(f"a file is at most {MAX_FILE_BYTES} bytes")
        user, path = user_of(request, spec), path_of(request)
        mode = int(request.query_params.get("mode", "644"), 8)
        with slots.take(spec.tenant_id):
            entry = await backend.write_file(
                sid(request),
                path,
                _bounded(request.stream(), MAX_FILE_BYTES),
                user=user,
                mode=mode & 0o7777,
            )
        return _json(entry)

    async def stat(request: Request) -> Response:
        backend, spec = manager.backend_of(sid(request))
        entry = await backend.stat(sid(request), path_of(request), user=user_of(request, spec))
        return _json(entry)

    async def list_dir(request: Request) -> Response:
        backend, spec = manager.backend_of(sid(request))
        depth = max(1, min(int(request.query_params.get("depth", "1")), 16))
        limit = max(1, min(int(request.query_params.get("limit", MAX_PAGE)), MAX_PAGE))
        cursor = request.query_params.get("cursor") or None
        with slots.take(spec.tenant_id):
            page = await backend.list_dir(
                sid(request),
                path_of(request),
                user=user_of(request, spec),
                depth=depth,
                limit=limit,
                cursor=cursor,
            )
        return _json(page)

    async def mkdir(request: Request) -> Response:
        backend, spec = manager.backend_of(sid(request))
        body = json.loads(await _body(request))
        path = rooted.normalise(str(body["path"]))
        user = user_of(request, spec, body.get("user"))
        return _json(await backend.make_dir(sid(request), path, user=user))

    async def remove(request: Request) -> Response:
        backend, spec = manager.backend_of(sid(request))
        body = json.loads(await _body(request))
        user = user_of(request, spec, body.get("user"))
        await backend.remove(sid(request), rooted.normalise(str(body["path"])), user=user)
        return Response(status_code=204)

    async def move(request: Request) -> Response:
        backend, spec = manager.backend_of(sid(request))
        body = json.loads(await _body(request))
        source = rooted.normalise(str(body["source"]))
        destination = rooted.normalise(str(body["destination"]))
        user = user_of(request, spec, body.get("user"))
        return _json(await backend.move(sid(request), source, destination, user=user))

    async def snapshot(request: Request) -> Response:
        body = json.loads(await _body(request))
        snapshot_id = str(body["snapshot_id"])
        return _json(await manager.snapshot(sid(request), snapshot_id), 201)

    async def snapshots(request: Request) -> Response:
        return _json(manager.snapshots())

    async def delete_snapshot(request: Request) -> Response:
        tenant_id = request.query_params.get("tenant_id", "")
        await manager.delete_snapshot(str(request.path_params["snapshot_id"]), tenant_id=tenant_id)
        return Response(status_code=204)

    one = "/sandboxes/{sandbox_id}"
    table: list[tuple[str, Handler, list[str]]] = [
        ("/sandboxes", create, ["POST"]),
        ("/sandboxes", inventory, ["GET"]),
        (one, get, ["GET"]),
        (one, delete, ["DELETE"]),
        (f"{one}/pause", pause, ["POST"]),
        (f"{one}/resume", resume, ["POST"]),
        (f"{one}/timeout", timeout, ["POST"]),
        (f"{one}/exec", exec_, ["POST"]),
        (f"{one}/files", read_file, ["GET"]),
        (f"{one}/files", write_file, ["PUT"]),
        (f"{one}/fs/stat", stat, ["GET"]),
        (f"{one}/fs/list", list_dir, ["GET"]),
        (f"{one}/fs/mkdir", mkdir, ["POST"]),
        (f"{one}/fs/remove", remove, ["POST"]),
        (f"{one}/fs/move", move, ["POST"]),
        (f"{one}/snapshot", snapshot, ["POST"]),
        ("/snapshots", snapshots, ["GET"]),
        ("/snapshots/{snapshot_id}", delete_snapshot, ["DELETE"]),
        *process_routes(ProcessTable(manager)),
        *watcher_routes(WatcherTable(manager, watch_limits)),
    ]
    return [Route(path, guarded(handler), methods=methods) for path, handler, methods in table]
