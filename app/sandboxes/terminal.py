"""A sandbox's terminal over a WebSocket: one implementation for the API
(``GET /v1/sandboxes/{id}/terminal``, the key in ``Authorization``) and the console
(``/console/sandboxes/{id}/terminal``, the session's cookie, its Origin checked); each
route authenticates, then hands the connection to ``serve`` with the tenant it acts for.

A login shell (bash, else sh) starts on a terminal of the sandbox's own (the node's
``ExecRequest.pty``), a process of the sandbox's process table like any other (tagged
``corral:terminal``: E2B's ``commands.list`` does not show it), within the tenant's
daily CPU budget. Frames:

    client -> server   binary: input (at most ``MAX_INPUT_BYTES`` a message)
                       text:   {"type": "resize", "cols": C, "rows": R}
    server -> client   binary: the terminal's output, as its bytes

The initial size is ``?cols=&rows=`` (80x24). The close says how it ended: 1000 with
"exit N" or "signal N" when the shell ended (the sandbox stopping kills it: its
WebSocket closes with it), 1003 a frame that is neither, 1009 input past the bound,
4000 + the HTTP status of the error that ended it (4404 no such sandbox of the tenant's,
4409 not running, 4503 its node unreachable) with its message. The client going away
kills the shell's session. Idle connections are pinged by the server (uvicorn's
``ws_ping_interval``), so proxies keep them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import AsyncIterator

from starlette.websockets import WebSocket, WebSocketDisconnect

from app.auth.principal import Principal
from app.errors import CorralError
from app.services import Services
from wire.processes import StartProcess
from wire.sandboxes import ExecEvent, ExecExit, ExecOutput, ExecRequest, ExecStarted, PtySize

log = logging.getLogger(__name__)

TAG = "corral:terminal"
#: the largest input message taken (the node's stdin route bounds a write at 16 MiB)
MAX_INPUT_BYTES = 64 << 10
#: output kept over the terminal's life (the node's cap; past it output is dropped)
OUTPUT_BYTES = 64 << 20
SHELL = ["/bin/sh", "-c", "if [ -x /bin/bash ]; then exec /bin/bash -l; fi; exec /bin/sh -l"]
DEFAULT_SIZE = PtySize(cols=80, rows=24)


class _Closed(Exception):
    """End the connection with ``code`` and ``reason``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


def _reason(text: str) -> str:
    """A close frame's reason: at most 123 bytes of UTF-8."""
    return text.encode()[:123].decode(errors="ignore")


def initial_size(websocket: WebSocket) -> PtySize:
    try:
        cols = int(websocket.query_params.get("cols", DEFAULT_SIZE.cols))
        rows = int(websocket.query_params.get("rows", DEFAULT_SIZE.rows))
        return PtySize(cols=cols, rows=rows)
    except ValueError as exc:  # pydantic's too
        raise _Closed(4422, "cols and rows must be 1-1000") from exc


def _resize(text: str) -> PtySize:
    try:
        message = json.loads(text)
        if not isinstance(message, dict) or message.get("type") != "resize":
            raise ValueError("not a resize")
        return PtySize(cols=message.get("cols"), rows=message.get("rows"))
    except ValueError as exc:
        raise _Closed(1003, 'text frames are {"type": "resize", "cols", "rows"}') from exc


def _end(event: ExecExit | None) -> _Closed:
    if event is None:
        return _Closed(1001, "the terminal's stream ended (its sandbox stopped?)")
    if event.exit_code is not None:
        return _Closed(1000, f"exit {event.exit_code}")
    return _Closed(1000, f"signal {event.signal}")


async def serve(
    websocket: WebSocket, services: Services, principal: Principal, sandbox_id: str
) -> None:
    """Accept the connection and run its terminal until either side ends it."""
    await websocket.accept()
    try:
        await _run(websocket, services, principal, sandbox_id)
    except _Closed as closed:
        await _close(websocket, closed.code, closed.reason)
    except CorralError as exc:
        await _close(websocket, 4000 + exc.status, exc.message)


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    with contextlib.suppress(Exception):  # the client may be gone already
        await websocket.close(code, _reason(reason))


async def _run(
    websocket: WebSocket, services: Services, principal: Principal, sandbox_id: str
) -> None:
    size = initial_size(websocket)
    node = await services.sandboxes.node_for(principal.tenant_id, sandbox_id)
    await services.sandboxes.admission.cpu(principal)
    request = ExecRequest(cmd=SHELL, pty=size, timeout_s=None, max_output_bytes=OUTPUT_BYTES)
    events: AsyncIterator[ExecEvent] = aiter(
        node.start_process(sandbox_id, StartProcess(request=request, tag=TAG))
    )
    started = await anext(events)
    if not isinstance(started, ExecStarted):
        raise _Closed(1011, "the terminal did not start")
    pid = started.pid
    log.info("sandbox=%s: terminal %d opened", sandbox_id, pid)

    async def output() -> ExecExit | None:
        async for event in events:
            if isinstance(event, ExecOutput):
                await websocket.send_bytes(event.data)
            elif isinstance(event, ExecExit):
                return event
        return None

    async def input() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            data, text = message.get("bytes"), message.get("text")
            if data is not None:
                if len(data) > MAX_INPUT_BYTES:
                    raise _Closed(1009, f"input messages are at most {MAX_INPUT_BYTES} bytes")
                await node.write_stdin(sandbox_id, pid, data)
            elif text is not None:
                await node.resize(sandbox_id, pid, _resize(text))

    reading = asyncio.create_task(output())
    writing = asyncio.create_task(input())
    try:
        done, _ = await asyncio.wait({reading, writing}, return_when=asyncio.FIRST_COMPLETED)
        if reading in done:
            raise _end(reading.result())
        with contextlib.suppress(WebSocketDisconnect):
            writing.result()  # the client went away, or a bad frame (_Closed)
    finally:
        for task in (reading, writing):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        if not reading.done() or reading.cancelled():
            with contextlib.suppress(Exception):  # the client left: the shell goes
                await node.signal_process(sandbox_id, pid, int(signal.SIGKILL))
        with contextlib.suppress(Exception):
            await events.aclose()  # type: ignore[attr-defined]
        log.info("sandbox=%s: terminal %d closed", sandbox_id, pid)
