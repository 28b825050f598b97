"""Watching a directory of a sandbox, read by polling: the node's table of watches.

A watch is on one directory (not its subdirectories) and made by the sandbox's backend
(``SandboxBackend.watch_dir``; containers: ``node.sandboxes.inotify``); its events
wait in it until read.

``WatcherTable`` keeps the watches by id, at most ``WatchLimits.per_sandbox`` per sandbox
(409 ``too_many_watchers``), ``per_tenant`` over a tenant's sandboxes on this node (429
``watcher_quota_exceeded``: one tenant's watchers never take another's) and
``per_node`` over all (503 ``no_capacity``, as when the kernel refuses a watch); a watch
whose sandbox has ended, or that nobody has read for ``IDLE_S``, is closed. Its log lines
name the watcher by id; the tenant's path appears bounded and escaped only.

Routes (added to the node's sandbox API by ``node.sandboxes.http``, same token):

    POST   /sandboxes/{id}/watchers                {"path", "user"} -> {"watcher_id"}
    GET    /sandboxes/{id}/watchers/{watcher_id}   -> WatchEvents (and empties it)
    DELETE /sandboxes/{id}/watchers/{watcher_id}
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from common.logsafe import loggable
from node.sandboxes.base import DirWatch, SandboxError, SandboxNotFound, SandboxPathError
from node.sandboxes.manager import SandboxManager
from wire.sandboxes import WatchEvents

log = logging.getLogger(__name__)

MAX_PER_SANDBOX = 32
IDLE_S = 600.0


@dataclass(frozen=True)
class WatchLimits:
    """Watchers the node holds at most (``NodeSettings.sandbox_max_watchers*``)."""

    per_sandbox: int = MAX_PER_SANDBOX
    per_tenant: int = 64
    per_node: int = 1024


class WatcherNotFound(SandboxError):
    status, code = 404, "watcher_not_found"


class TooManyWatchers(SandboxError):
    status, code = 409, "too_many_watchers"


class WatcherQuotaExceeded(SandboxError):
    status, code = 429, "watcher_quota_exceeded"


class NodeWatchersFull(SandboxError):
    status, code = 503, "no_capacity"


@dataclass
class _Watcher:
    sandbox_id: str
    tenant_id: str
    watch: DirWatch
    read_at: float = field(default_factory=time.monotonic)


class WatcherTable:
    def __init__(self, manager: SandboxManager, limits: WatchLimits | None = None) -> None:
        self._manager = manager
        self.limits = limits or WatchLimits()
        self._watchers: dict[str, _Watcher] = {}
        manager.on_close(self.close)

    async def create(self, sandbox_id: str, path: str, user: str | None = None) -> str:
        self._sweep()
        backend, spec = self._manager.backend_of(sandbox_id)
        self._admit(sandbox_id, spec.tenant_id)
        watch = await backend.watch_dir(sandbox_id, path, user=user or spec.user)
        watcher_id = secrets.token_hex(8)
        self._watchers[watcher_id] = _Watcher(sandbox_id, spec.tenant_id, watch)
        log.info("sandbox=%s: watcher %s on %s", sandbox_id, watcher_id, loggable(path))
        return watcher_id

    def _admit(self, sandbox_id: str, tenant_id: str) -> None:
        """Refuse a watcher past the sandbox's, the tenant's or the node's cap."""
        limits, watchers = self.limits, self._watchers.values()
        if sum(w.sandbox_id == sandbox_id for w in watchers) >= limits.per_sandbox:
            raise TooManyWatchers(f"sandbox {sandbox_id} has {limits.per_sandbox} watchers")
        if sum(w.tenant_id == tenant_id for w in watchers) >= limits.per_tenant:
            raise WatcherQuotaExceeded(
                f"the tenant holds {limits.per_tenant} watchers on this node, its most"
            )
        if len(self._watchers) >= limits.per_node:
            raise NodeWatchersFull(f"the node holds {limits.per_node} watchers, its most")

    def events(self, sandbox_id: str, watcher_id: str) -> WatchEvents:
        watcher = self._get(sandbox_id, watcher_id)
        watcher.read_at = time.monotonic()
        return watcher.watch.drain()

    def remove(self, sandbox_id: str, watcher_id: str) -> None:
        self._get(sandbox_id, watcher_id)
        self._watchers.pop(watcher_id).watch.close()

    def close(self) -> None:
        for watcher in self._watchers.values():
            watcher.watch.close()
        self._watchers.clear()

    def _get(self, sandbox_id: str, watcher_id: str) -> _Watcher:
        watcher = self._watchers.get(watcher_id)
        if watcher is None or watcher.sandbox_id != sandbox_id:
            raise WatcherNotFound(f"no watcher {watcher_id} in sandbox {sandbox_id}")
        return watcher

    def _sweep(self) -> None:
        """Close the watches of sandboxes that ended and of readers that went away."""
        now = time.monotonic()
        for watcher_id, watcher in list(self._watchers.items()):
            try:
                self._manager.backend_of(watcher.sandbox_id)
                stale = now - watcher.read_at > IDLE_S
            except SandboxNotFound:
                stale = True
            if stale:
                self._watchers.pop(watcher_id).watch.close()


Handler = Callable[[Request], Awaitable[Response]]


def watcher_routes(table: WatcherTable) -> list[tuple[str, Handler, list[str]]]:
    def ids(request: Request) -> tuple[str, str]:
        return str(request.path_params["sandbox_id"]), str(request.path_params["watcher_id"])

    async def create(request: Request) -> Response:
        body = json.loads(await request.body() or b"{}")
        path = body.get("path") if isinstance(body, dict) else None
        if not isinstance(path, str) or not path.startswith("/"):
            raise SandboxPathError("path must be an absolute path")
        user = body.get("user") if isinstance(body, dict) else None
        if user is not None and not isinstance(user, str):
            raise SandboxPathError("user must be a string")
        sandbox_id = str(request.path_params["sandbox_id"])
        return JSONResponse({"watcher_id": await table.create(sandbox_id, path, user)}, 201)

    async def events(request: Request) -> Response:
        body = table.events(*ids(request)).model_dump_json()
        return Response(body, media_type="application/json")

    async def remove(request: Request) -> Response:
        table.remove(*ids(request))
        return Response(status_code=204)

    one = "/sandboxes/{sandbox_id}/watchers"
    return [
        (one, create, ["POST"]),
        (f"{one}/{{watcher_id}}", events, ["GET"]),
        (f"{one}/{{watcher_id}}", remove, ["DELETE"]),
    ]
