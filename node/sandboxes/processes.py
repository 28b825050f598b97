"""Background processes: commands that outlive the request that started them.

``ProcessTable`` keeps, per sandbox, the processes started through it (by pid, with an
optional tag). One pump task per process reads its events once and fans them out to
every stream following it: the stream that started it, and any number that connect
later. Output that comes while nobody follows is kept for the next follower, which gets
it first (the *backlog*), then what comes after. Nothing is drained that nobody reads:
while the backlog or any follower's queue holds ``BUFFER_BYTES`` of output, the process's
output is paused (``Process.pause_output``: the node stops reading its pipes, which fill,
and the command blocks on write, as on a pipe nobody reads) until a follower takes it.
So an unread ``yes`` costs the node at most ``BUFFER_BYTES`` (plus a few chunks in
flight) and no CPU. A process leaves the table when it exits, is killed by its own
``timeout_s``, or its sandbox ends; a follower going away never stops it.

Routes (added to the node's sandbox API by ``node.sandboxes.http``, same token):

    POST /sandboxes/{id}/processes                       StartProcess -> NDJSON ExecEvents
    GET  /sandboxes/{id}/processes                       -> [ProcessInfo]
    GET  /sandboxes/{id}/processes/{pid}/stream          -> NDJSON: started, then events
    POST /sandboxes/{id}/processes/{pid}/signal          ProcessSignal
    POST /sandboxes/{id}/processes/{pid}/stdin           raw bytes
    POST /sandboxes/{id}/processes/{pid}/close-stdin
    POST /sandboxes/{id}/processes/{pid}/resize          ProcessResize (a terminal's)

A process started with ``ExecRequest.pty`` (a terminal) is one of the table's like any
other: its output is the ``pty`` stream, its stdin the terminal's input.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from node.sandboxes.base import Process, SandboxError
from node.sandboxes.manager import SandboxManager
from wire.processes import ProcessInfo, ProcessResize, ProcessSignal, StartProcess
from wire.sandboxes import ExecEvent, ExecExit, ExecOutput, ExecStarted

log = logging.getLogger(__name__)

#: output held per process for followers that have not taken it (or for the next one to
#: connect) before the process's output is paused
BUFFER_BYTES = 1 << 20
MAX_STDIN_BYTES = 16 << 20
MAX_REQUEST_BYTES = 1 << 20
#: pids handed out when the backend could not tell a process's own (it exited at once)
_SYNTHETIC_PIDS = itertools.count(1 << 22)


class ProcessNotFound(SandboxError):
    status, code = 404, "process_not_found"


class StdinClosed(SandboxError):
    status, code = 409, "stdin_closed"


def _size(event: ExecEvent | None) -> int:
    return len(event.data) if isinstance(event, ExecOutput) else 0


class _Follower:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[ExecEvent | None] = asyncio.Queue()
        self.queued_bytes = 0

    def offer(self, event: ExecEvent | None) -> None:
        self.queued_bytes += _size(event)
        self.queue.put_nowait(event)

    async def take(self) -> ExecEvent | None:
        event = await self.queue.get()
        self.queued_bytes -= _size(event)
        return event


@dataclass
class _Running:
    sandbox_id: str
    pid: int
    start: StartProcess
    process: Process
    started_at: float
    followers: set[_Follower] = field(default_factory=set)
    pump: asyncio.Task[None] | None = None
    #: output that came while nobody followed, for the next follower
    backlog: collections.deque[ExecEvent] = field(default_factory=collections.deque)
    backlog_bytes: int = 0
    paused: bool = False

    def regulate(self) -> None:
        """Pause the process's output while ``BUFFER_BYTES`` wait to be taken (in the
        backlog, or in any follower's queue), resume it once none is that full."""
        full = self.backlog_bytes >= BUFFER_BYTES or any(
            follower.queued_bytes >= BUFFER_BYTES for follower in self.followers
        )
        if full != self.paused:
            self.paused = full
            if full:
                self.process.pause_output()
            else:
                self.process.resume_output()

    def info(self) -> ProcessInfo:
        request = self.start.request
        return ProcessInfo(
            pid=self.pid,
            tag=self.start.tag,
            cmd=request.cmd,
            env=request.env,
            cwd=request.cwd,
            user=request.user,
            started_at=self.started_at,
        )


class ProcessTable:
    def __init__(self, manager: SandboxManager) -> None:
        self._manager = manager
        self._running: dict[str, dict[int, _Running]] = {}

    async def start(self, sandbox_id: str, start: StartProcess) -> AsyncIterator[ExecEvent]:
        """Start a process and follow it from its first event."""
        process = await self._manager.exec(sandbox_id, start.request)
        table = self._running.setdefault(sandbox_id, {})
        pid = process.pid if process.pid and process.pid not in table else next(_SYNTHETIC_PIDS)
        running = _Running(sandbox_id, pid, start, process, time.time())
        follower = _Follower()
        running.followers.add(follower)
        follower.offer(ExecStarted(pid=pid))
        table[pid] = running
        running.pump = asyncio.create_task(self._pump(running), name=f"process-{pid}")
        log.debug("sandbox=%s: process %d started (tag %s)", sandbox_id, pid, start.tag)
        return self._follow(running, follower)

    def list(self, sandbox_id: str) -> list[ProcessInfo]:
        return [r.info() for r in self._running.get(sandbox_id, {}).values()]

    def follow(self, sandbox_id: str, pid: int) -> AsyncIterator[ExecEvent]:
        """Follow a running process: a ``started`` event, the output nobody took yet
        (the backlog), then what comes from now on."""
        running = self._get(sandbox_id, pid)
        follower = _Follower()
        follower.offer(ExecStarted(pid=pid))
        while running.backlog:
            follower.offer(running.backlog.popleft())
        running.backlog_bytes = 0
        running.followers.add(follower)
        return self._follow(running, follower)

    async def signal(self, sandbox_id: str, pid: int, signum: int) -> None:
        log.info("sandbox=%s: signal %d to process %d", sandbox_id, signum, pid)
        await self._get(sandbox_id, pid).process.signal(signum)

    async def write_stdin(self, sandbox_id: str, pid: int, data: bytes) -> None:
        try:
            await self._get(sandbox_id, pid).process.write_stdin(data)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise StdinClosed(f"the stdin of process {pid} is closed") from exc

    async def close_stdin(self, sandbox_id: str, pid: int) -> None:
        await self._get(sandbox_id, pid).process.close_stdin()

    async def resize(self, sandbox_id: str, pid: int, resize: ProcessResize) -> None:
        await self._get(sandbox_id, pid).process.resize(resize.size)

    async def close(self) -> None:
        """Stop following (the processes themselves end with their sandboxes)."""
        for table in list(self._running.values()):
            for running in list(table.values()):
                if running.pump is not None:
                    running.pump.cancel()

    # --- internals --------------------------------------------------------------------
    def _get(self, sandbox_id: str, pid: int) -> _Running:
        running = self._running.get(sandbox_id, {}).get(pid)
        if running is None:
            raise ProcessNotFound(f"no process {pid} in sandbox {sandbox_id}")
        return running

    async def _pump(self, running: _Running) -> None:
        exited = False
        try:
            async for event in running.process.events():
                if isinstance(event, ExecStarted):
                    continue  # each follower got its own, with the table's pid
                exited = exited or isinstance(event, ExecExit)
                if not running.followers:
                    running.backlog.append(event)
                    running.backlog_bytes += _size(event)
                for follower in list(running.followers):
                    follower.offer(event)
                running.regulate()
        except Exception:
            log.exception(
                "sandbox=%s: process %d: its events failed", running.sandbox_id, running.pid
            )
        finally:
            table = self._running.get(running.sandbox_id, {})
            if table.get(running.pid) is running:
                del table[running.pid]
            if not table:
                self._running.pop(running.sandbox_id, None)
            for follower in list(running.followers):
                follower.offer(None)
            log.debug(
                "sandbox=%s: process %d %s",
                running.sandbox_id,
                running.pid,
                "exited" if exited else "is no longer followed",
            )

    @staticmethod
    def _follow(running: _Running, follower: _Follower) -> AsyncIterator[ExecEvent]:
        return _Stream(running, follower)


class _Stream:
    """One follower's events. Closed (or dropped) before it was read to its end, it
    leaves the process at once, even if it was never read at all (a generator that never
    started would never run its clean-up, and its full queue would keep the process
    paused)."""

    def __init__(self, running: _Running, follower: _Follower) -> None:
        self._running = running
        self._follower: _Follower | None = follower

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> ExecEvent:
        follower = self._follower
        if follower is None:
            raise StopAsyncIteration
        try:
            event = await follower.take()
        except BaseException:
            self._leave()
            raise
        if event is None:
            self._leave()
            raise StopAsyncIteration
        self._running.regulate()
        return event

    async def aclose(self) -> None:
        self._leave()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at exit the loop may be gone
            self._leave()

    def _leave(self) -> None:
        follower, self._follower = self._follower, None
        if follower is not None:
            self._running.followers.discard(follower)
            self._running.regulate()


Handler = Callable[[Request], Awaitable[Response]]


async def _read(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ProcessBodyTooLarge(f"the body is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class ProcessBodyTooLarge(SandboxError):
    status, code = 413, "payload_too_large"


def _ndjson(events: AsyncIterator[ExecEvent]) -> Response:
    async def lines() -> AsyncIterator[bytes]:
        async for event in events:
            yield event.model_dump_json().encode() + b"\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


def process_routes(table: ProcessTable) -> list[tuple[str, Handler, list[str]]]:
    """The process routes, as ``(path, handler, methods)`` for the node's API to guard."""

    def sid(request: Request) -> str:
        return str(request.path_params["sandbox_id"])

    def pid(request: Request) -> int:
        return int(request.path_params["pid"])

    async def start(request: Request) -> Response:
        body = StartProcess.model_validate_json(await _read(request, MAX_REQUEST_BYTES))
        return _ndjson(await table.start(sid(request), body))

    async def listing(request: Request) -> Response:
        return JSONResponse([p.model_dump(mode="json") for p in table.list(sid(request))])

    async def follow(request: Request) -> Response:
        return _ndjson(table.follow(sid(request), pid(request)))

    async def signal(request: Request) -> Response:
        body = ProcessSignal.model_validate_json(await _read(request, MAX_REQUEST_BYTES))
        await table.signal(sid(request), pid(request), body.signal)
        return Response(status_code=204)

    async def stdin(request: Request) -> Response:
        await table.write_stdin(sid(request), pid(request), await _read(request, MAX_STDIN_BYTES))
        return Response(status_code=204)

    async def close_stdin(request: Request) -> Response:
        await table.close_stdin(sid(request), pid(request))
        return Response(status_code=204)

    async def resize(request: Request) -> Response:
        body = ProcessResize.model_validate_json(await _read(request, MAX_REQUEST_BYTES))
        await table.resize(sid(request), pid(request), body)
        return Response(status_code=204)

    one = "/sandboxes/{sandbox_id}/processes"
    each = one + "/{pid:int}"
    return [
        (one, start, ["POST"]),
        (one, listing, ["GET"]),
        (f"{each}/stream", follow, ["GET"]),
        (f"{each}/signal", signal, ["POST"]),
        (f"{each}/stdin", stdin, ["POST"]),
        (f"{each}/close-stdin", close_stdin, ["POST"]),
        (f"{each}/resize", resize, ["POST"]),
    ]
