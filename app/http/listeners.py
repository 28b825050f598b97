"""Where the API is served, and the one listener on which a request may act without a key.

Two listeners, one app, one process:

* the API listener (``host``:``port``; ``api_config`` for ``corral serve|gateway``): every
  request needs a key. uvicorn believes ``X-Forwarded-For`` and ``X-Forwarded-Proto``
  only from ``trusted_proxies`` (by default from nobody), and no access decision is made
  from a peer address anyway.
* the keyless listener (``serving_keyless``, entered by the app lifespan): a TCP port on a
  loopback address (``keyless_port``; settings refuse any other address) and/or a Unix
  socket created mode 0600 (``keyless_socket``). Requests that arrive on it are marked
  in their ASGI scope (``KEYLESS``) by ``KeylessListener``, and only marked requests may
  act as ``default_tenant`` without a key (``app.auth.authenticator.Authenticator``). The mark is
  set by this process for the socket a connection arrived on: no header, peer address or
  proxy can set it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import socket
import stat
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from app.settings import Settings
from node.agent.http import EmbeddedServer

log = logging.getLogger(__name__)

#: The ASGI scope key that marks a request as arrived on the keyless listener.
KEYLESS = "corral.keyless"
#: How long, at shutdown, requests in flight on the keyless listener may finish.
_GRACE_S = 15


def is_keyless(scope: MutableMapping[str, Any]) -> bool:
    """Whether the request arrived on the keyless listener."""
    return scope.get(KEYLESS) is True


class KeylessListener:
    """The app as the keyless listener serves it: every HTTP request marked ``KEYLESS``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope = {**scope, KEYLESS: True}
        await self.app(scope, receive, send)


#: how long the API keeps an idle connection open
KEEP_ALIVE_S = 75
#: a WebSocket (a sandbox's terminal) is pinged this often, and closed if a ping goes
#: unanswered as long: proxies keep an idle terminal, a vanished client is noticed
WS_PING_S = 20.0
#: the largest WebSocket message taken (the terminal takes 64 KiB of input a message)
WS_MAX_BYTES = 1 << 20


def api_config(app: ASGIApp, settings: Settings, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration of the API listener: proxy headers only from
    ``settings.trusted_proxies``."""
    proxies = settings.proxies
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        proxy_headers=bool(proxies),
        forwarded_allow_ips=proxies,
        access_log=False,
        # longer than clients keep idle connections (httpx, requests: 5 s or less), so a
        # client's request never meets a connection the server is closing
        timeout_keep_alive=KEEP_ALIVE_S,
        ws_ping_interval=WS_PING_S,
        ws_ping_timeout=WS_PING_S,
        ws_max_size=WS_MAX_BYTES,
        **options,
    )


@contextlib.asynccontextmanager
async def serving_keyless(app: ASGIApp, settings: Settings) -> AsyncIterator[list[str]]:
    """Serve ``app`` on the keyless listener(s) of ``settings`` while the block runs;
    yields their addresses (none when neither ``keyless_port`` nor ``keyless_socket``)."""
    async with contextlib.AsyncExitStack() as stack:
        sockets: list[socket.socket] = []
        if settings.keyless_port is not None:
            sockets.append(stack.enter_context(_tcp(settings.keyless_host, settings.keyless_port)))
        if settings.keyless_socket is not None:
            sockets.append(stack.enter_context(_unix(settings.keyless_socket)))
        if not sockets:
            yield []
            return
        server = EmbeddedServer(
            uvicorn.Config(
                KeylessListener(app),
                proxy_headers=False,
                access_log=False,
                lifespan="off",
                log_level="warning",
                timeout_graceful_shutdown=_GRACE_S,
            )
        )
        task = asyncio.create_task(server.serve(sockets=sockets), name="corral-keyless")
        try:
            while not server.started:
                if task.done():
                    await task  # raises what stopped it
                    raise RuntimeError("the keyless listener did not start")
                await asyncio.sleep(0.01)
            addresses = [_address(sock) for sock in sockets]
            log.info(
                "keyless SandboxFusion access (as %s) on %s", settings.default_tenant, addresses
            )
            yield addresses
        finally:
            server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await task


@contextlib.contextmanager
def _tcp(host: str, port: int) -> Any:
    if not ipaddress.ip_address(host).is_loopback:  # settings refuse it too
        raise ValueError(f"the keyless listener binds loopback addresses only, not {host}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise RuntimeError(f"the keyless listener cannot bind {host}:{port}: {exc}") from None
        yield sock
    finally:
        sock.close()


@contextlib.contextmanager
def _unix(path: Path) -> Any:
    """A Unix socket at ``path``, mode 0600 before it listens (a stale one is replaced;
    one another process listens on is not)."""
    _clear_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    inode: int | None = None
    try:
        try:
            sock.bind(str(path))
        except OSError as exc:
            raise RuntimeError(f"the keyless listener cannot bind {path}: {exc}") from None
        inode = os.stat(path).st_ino
        os.chmod(path, 0o600)  # connecting needs write access; nobody can before listen()
        yield sock
    finally:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            if inode is not None and os.stat(path).st_ino == inode:
                path.unlink()


def _clear_stale(path: Path) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise RuntimeError(f"the keyless listener's path {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise RuntimeError(f"the keyless listener's socket {path}: {exc}") from None
        path.unlink()
        return
    finally:
        probe.close()
    raise RuntimeError(f"the keyless listener's socket {path} is in use by another process")


def _address(sock: socket.socket) -> str:
    name = sock.getsockname()
    if sock.family == socket.AF_UNIX:
        return f"unix:{name}"
    host = f"[{name[0]}]" if sock.family == socket.AF_INET6 else name[0]
    return f"http://{host}:{name[1]}"
