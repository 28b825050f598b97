"""envd, the daemon the E2B SDKs talk to inside a sandbox, served by the gateway.

The SDK sends every in-sandbox call to ``E2B_SANDBOX_URL`` with ``E2b-Sandbox-Id``; each
is authenticated (``app.api.e2b.auth``), routed to the node that holds the sandbox through
``Sandboxes`` and answered in envd's shapes:

    /process.Process/Start|Connect          server streams (Connect), from the node's
                                            process table: started, data, end, keepalives
    /process.Process/List|SendSignal|SendInput|CloseStdin|Update     unary
    /process.Process/StreamInput            client stream of stdin
    /filesystem.Filesystem/Stat|ListDir|MakeDir|Move|Remove   unary
    /filesystem.Filesystem/CreateWatcher|GetWatcherEvents|RemoveWatcher   unary (one
                                            directory, not recursive: the node's inotify)
    /filesystem.Filesystem/WatchDir         server stream: the same watcher, polled
    GET /files?path=&username=              the file's bytes, streamed
    POST /files?path=&username=             octet-stream or multipart upload -> [WriteInfo],
                                            each file streamed to the node as it arrives
    GET /health                             204 running, 502 "... was not found" if not

Every file call acts as the user named (``Authorization: Basic`` or ``username=``; default:
the sandbox's user) with that user's permissions inside the sandbox, as envd does: writing
where that user may not is ``permission_denied``. ListDir answers at most ``LIST_CAP``
entries (``resource_exhausted`` past them).

A command runs as ``/bin/bash -l -c CMD`` (what the SDK sends), once the tenant's daily
CPU budget allows (else ``resource_exhausted``: ``app.sandboxes.admission``), and outlives
the stream that started it; ``Connect-Timeout-Ms`` is its timeout, which kills its whole session, as
envd does. ``Start`` with ``pty: {size}`` runs the command on a terminal of the sandbox's
own (``wire.sandboxes.ExecRequest.pty``): its output comes as ``data: {pty}``, input goes
as ``input: {pty}`` (SendInput, StreamInput), ``Update`` with ``pty: {size}`` resizes it;
signals and ``Connect`` as for any process. Recursive watching is refused
(``unimplemented``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import posixpath
import signal
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.api.e2b import connect
from app.api.e2b.auth import SandboxCaller, home_of, run_as, sandbox_caller, services
from app.api.e2b.connect import Message
from app.api.e2b.errors import (
    Handler,
    NotSupported,
    SandboxGone,
    connect_unary_error,
    guarded,
    rest_error,
)
from app.errors import BadRequest, InvalidPath, NotFound
from app.sandboxes.files import (
    FileAnswer,
    MultipartFiles,
    bounded,
    file_limit,
    list_capped,
    refuse_declared_over,
    transfer_idle,
    upload_body,
)
from app.sandboxes.nodes import NodeClient
from common.logsafe import loggable
from wire.processes import ProcessInfo, StartProcess
from wire.sandboxes import (
    ExecEvent,
    ExecExit,
    ExecOutput,
    ExecRequest,
    ExecStarted,
    FileEntry,
    FsEvent,
    PtySize,
)

log = logging.getLogger(__name__)

#: the tag prefix of Corral's own processes (code interpreter workers): not listed
INTERNAL_TAG = "corral:"
KEEPALIVE_DEFAULT_S = 50.0
#: the most entries a ListDir answers (envd's has no pages): past it, resource_exhausted
LIST_CAP = 10_000
#: a background process's output kept over its whole life (the rest is counted, dropped)
PROCESS_OUTPUT_BYTES = 64 << 20
#: how often a WatchDir stream asks the node for its watcher's events
WATCH_POLL_S = 0.1
SIGNALS = {"SIGNAL_SIGKILL": signal.SIGKILL, "SIGNAL_SIGTERM": signal.SIGTERM, 9: 9, 15: 15}
_FILE_TYPES = {
    "file": "FILE_TYPE_FILE",
    "dir": "FILE_TYPE_DIRECTORY",
    "symlink": "FILE_TYPE_SYMLINK",
}


async def _node(request: Request) -> tuple[SandboxCaller, NodeClient]:
    caller = await sandbox_caller(request)
    return caller, await services(request).sandboxes.node_of(caller.row)


def _default_user(caller: SandboxCaller) -> str:
    return str((caller.row.spec or {}).get("user") or "user")


def _user(request: Request) -> str | None:
    """Who an operation acts as: ``Authorization: Basic`` (RPCs) or ``username=`` (/files)."""
    named = request.query_params.get("username")
    return run_as(request) or (named if named else None)


def _path(request: Request, caller: SandboxCaller, path: object) -> str:
    if not isinstance(path, str) or not path or "\x00" in path:
        raise InvalidPath("a path is required")
    home = home_of(_user(request), _default_user(caller))
    return posixpath.normpath(posixpath.join(home, path))


# --- messages ---------------------------------------------------------------------------
def _event(event: ExecEvent) -> Message:
    """A node event as envd's ``ProcessEvent``: output as the exact bytes the command
    wrote (envd's ``data`` is bytes, base64 in JSON; the SDK decodes them itself)."""
    if isinstance(event, ExecStarted):
        return {"start": {"pid": event.pid}}
    if isinstance(event, ExecOutput):
        return {"data": {event.stream: base64.b64encode(event.data).decode()}}
    return {"end": _end(event)}


def _end(event: ExecExit) -> Message:
    if event.exit_code is not None:
        end: Message = {
            "exitCode": event.exit_code,
            "exited": True,
            "status": f"exit status {event.exit_code}",
        }
    else:
        name = signal.Signals(event.signal).name if event.signal in _SIGNUMS else "killed"
        end = {"exitCode": -1, "exited": False, "status": f"signal: {name.lower()}"}
    if event.error:
        end["error"] = event.error
    elif event.timed_out:
        end["error"] = "the command's timeout killed it"
    return end


_SIGNUMS = {int(s) for s in signal.Signals}


def _selected(message: Message, processes: list[ProcessInfo] | None = None) -> int:
    selector = message.get("process")
    if not isinstance(selector, dict):
        raise BadRequest("process selector is required")
    if "pid" in selector:
        return int(selector["pid"])
    if "tag" in selector and processes is not None:
        for p in processes:
            if p.tag == selector["tag"]:
                return p.pid
        raise NotFound(f"no process tagged {selector['tag']!r}")
    raise BadRequest("select a process by pid or tag")


async def _pid(message: Message, node: NodeClient, sandbox_id: str) -> int:
    selector = message.get("process")
    if isinstance(selector, dict) and "tag" in selector and "pid" not in selector:
        return _selected(message, await node.processes(sandbox_id))
    return _selected(message)


def entry_info(entry: FileEntry) -> Message:
    """A node's file entry as envd's ``EntryInfo``."""
    info: Message = {
        "name": entry.name,
        "type": _FILE_TYPES.get(entry.type.value, "FILE_TYPE_UNSPECIFIED"),
        "path": entry.path,
        "size": str(entry.size),
        "mode": entry.mode,
        "permissions": _permissions(entry),
        "owner": entry.owner,
        "group": entry.group,
        "modifiedTime": datetime.fromtimestamp(entry.modified_at, UTC)
        .isoformat()
        .replace("+00:00", "Z"),
    }
    if entry.symlink_target is not None:
        info["symlinkTarget"] = entry.symlink_target
        info["isSymlink"] = True
    return info


def _permissions(entry: FileEntry) -> str:
    kind = {"dir": "d", "symlink": "L"}.get(entry.type.value, "-")
    bits = "".join(ch if entry.mode & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx"))
    return kind + bits


# --- process.Process --------------------------------------------------------------------
async def _follow(
    events: AsyncIterator[ExecEvent], keepalive_s: float, sandbox_id: str
) -> AsyncIterator[Message]:
    """The node's events as envd's stream, with a keepalive when nothing else came."""
    iterator = aiter(events)
    pending: asyncio.Task[ExecEvent] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({pending}, timeout=keepalive_s)
            if not done:
                yield {"event": {"keepalive": {}}}
                continue
            try:
                event = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield {"event": _event(event)}
            if isinstance(event, ExecExit):
                return
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        with contextlib.suppress(Exception):
            await iterator.aclose()  # type: ignore[attr-defined]
        log.debug("sandbox=%s: process stream closed", sandbox_id)


def _keepalive_s(request: Request) -> float:
    try:
        return max(1.0, float(request.headers.get("keepalive-ping-interval", KEEPALIVE_DEFAULT_S)))
    except ValueError:
        return KEEPALIVE_DEFAULT_S


async def process_start(request: Request) -> Response:
    try:
        caller, node = await _node(request)
        await services(request).sandboxes.admission.cpu(caller.principal)
        message = await connect.first_request(request)
        pty = _pty_size(message["pty"]) if message.get("pty") else None
        config = message.get("process") or {}
        if not isinstance(config, dict) or not isinstance(config.get("cmd"), str):
            raise BadRequest("process.cmd is required")
        args = config.get("args") or []
        envs = config.get("envs") or {}
        if not isinstance(args, list) or not isinstance(envs, dict):
            raise BadRequest("process.args must be a list and process.envs an object")
        user = run_as(request)
        cwd = config.get("cwd")
        start = StartProcess(
            request=ExecRequest(
                cmd=[config["cmd"], *map(str, args)],
                env={str(k): str(v) for k, v in envs.items()},
                cwd=_path(request, caller, cwd) if cwd else None,
                user=user,
                stdin_open=bool(message.get("stdin")),
                timeout_s=connect.timeout_s(request),
                max_output_bytes=PROCESS_OUTPUT_BYTES,
                pty=pty,
            ),
            tag=message.get("tag") if isinstance(message.get("tag"), str) else None,
        )
        if start.tag is not None and start.tag.startswith(INTERNAL_TAG):
            raise BadRequest(f"tags starting {INTERNAL_TAG!r} are Corral's own")
        log.debug("sandbox=%s: e2b start %s", caller.sandbox_id, loggable(start.request.cmd[0]))
        events = node.start_process(caller.sandbox_id, start)
    except Exception as exc:
        return connect.stream_error(exc)
    return connect.stream_response(_follow(events, _keepalive_s(request), caller.sandbox_id))


async def process_connect(request: Request) -> Response:
    try:
        caller, node = await _node(request)
        message = await connect.first_request(request)
        pid = await _pid(message, node, caller.sandbox_id)
        events = node.follow_process(caller.sandbox_id, pid)
    except Exception as exc:
        return connect.stream_error(exc)
    return connect.stream_response(_follow(events, _keepalive_s(request), caller.sandbox_id))


async def process_list(request: Request) -> Response:
    caller, node = await _node(request)
    await connect.unary_request(request)
    listed = []
    for p in await node.processes(caller.sandbox_id):
        if p.tag is not None and p.tag.startswith(INTERNAL_TAG):
            continue
        config: Message = {"cmd": p.cmd[0], "args": p.cmd[1:], "envs": p.env}
        if p.cwd is not None:
            config["cwd"] = p.cwd
        info: Message = {"config": config, "pid": p.pid}
        if p.tag is not None:
            info["tag"] = p.tag
        listed.append(info)
    return connect.unary_response({"processes": listed})


async def process_signal(request: Request) -> Response:
    caller, node = await _node(request)
    message = await connect.unary_request(request)
    signum = SIGNALS.get(message.get("signal", ""))
    if signum is None:
        raise BadRequest("signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM")
    pid = await _pid(message, node, caller.sandbox_id)
    await node.signal_process(caller.sandbox_id, pid, int(signum))
    return connect.unary_response({})


def _pty_size(pty: object) -> PtySize:
    """envd's ``PTY`` message (``{"size": {"cols", "rows"}}``) as the node's size."""
    size = pty.get("size") if isinstance(pty, dict) else None
    if not isinstance(size, dict):
        raise BadRequest("pty.size is required")
    try:
        return PtySize(cols=int(size.get("cols") or 0), rows=int(size.get("rows") or 0))
    except (TypeError, ValueError) as exc:
        raise BadRequest("pty.size needs cols and rows of 1-1000") from exc


def _stdin_bytes(message: Message) -> bytes:
    """The bytes of envd's ``ProcessInput``: ``stdin`` or ``pty`` (a terminal's input:
    both go to the process's input, a terminal's being its master)."""
    data = message.get("input")
    if not isinstance(data, dict):
        raise BadRequest("input is required")
    return base64.b64decode(str(data.get("pty", data.get("stdin", ""))), validate=True)


async def process_send_input(request: Request) -> Response:
    caller, node = await _node(request)
    message = await connect.unary_request(request)
    pid = await _pid(message, node, caller.sandbox_id)
    await node.write_stdin(caller.sandbox_id, pid, _stdin_bytes(message))
    return connect.unary_response({})


async def process_close_stdin(request: Request) -> Response:
    caller, node = await _node(request)
    message = await connect.unary_request(request)
    await node.close_stdin(caller.sandbox_id, await _pid(message, node, caller.sandbox_id))
    return connect.unary_response({})


async def process_stream_input(request: Request) -> Response:
    async def answer() -> AsyncIterator[Message]:
        caller, node = await _node(request)
        pid: int | None = None
        async for message in connect.stream_requests(request):
            if "start" in message:
                pid = await _pid(message["start"] or {}, node, caller.sandbox_id)
            elif "data" in message:
                if pid is None:
                    raise BadRequest("the stream must start by selecting a process")
                await node.write_stdin(caller.sandbox_id, pid, _stdin_bytes(message["data"]))
        yield {}

    return connect.stream_response(answer())


async def process_update(request: Request) -> Response:
    """envd's ``Update``: a new size for the process's terminal (``pty.size``)."""
    caller, node = await _node(request)
    message = await connect.unary_request(request)
    if not message.get("pty"):
        raise BadRequest("pty is required")
    pid = await _pid(message, node, caller.sandbox_id)
    await node.resize(caller.sandbox_id, pid, _pty_size(message["pty"]))
    return connect.unary_response({})


# --- filesystem.Filesystem --------------------------------------------------------------
async def fs_stat(request: Request) -> Response:
    caller, node = await _node(request)
    message = await connect.unary_request(request)
    path = _path(request, caller, message.get("path"))
    entry = await node.stat(caller.sandbox_id, path, user=run_as(request))
    return connect.unary_response({"entry": entry_info(entry)})


async def fs_list(request: Request) -> Response:
    """envd's ListDir has no pages: the node's are gathered, up to ``LIST_CAP`` entries;
    a larger listing is refused (``resource_exhausted``), never cut short silently."""
    caller, node = await _node(request)
    message = await connect.unary_request(request)
    path = _path(request, caller, message.get("path"))
    depth = max(1, min(int(message.get("depth") or 1), 16))
    entries = await list_capped(
        node, caller.sandbox_id, path, depth=depth, user=run_as(request), cap=LIST_CAP
    )
    return connect.unary_response({"entries": [entry_info(e) for e in entries]})


async def fs_make_dir(request: Request) -> Response:
    caller, node = await _node(request)
    message = await connect.unary_request(request)
    path = _path(request, caller, message.get("path"))
    entry = await node.make_dir(caller.sandbox_id, path, user=run_as(request))
    return connect.unary_response({"entry": entry_info(entry)})


async def fs_move(request: Request) -> Response:
    caller, node = await _node(request)
    message = await connect.unary_request(request)
    source = _path(request, caller, message.get("source"))
    destination = _path(request, caller, message.get("destination"))
    entry = await node.move(caller.sandbox_id, source, destination, user=run_as(request))
    return connect.unary_response({"entry": entry_info(entry)})


async def fs_remove(request: Request) -> Response:
    caller, node = await _node(request)
    message = await connect.unary_request(request)
    path = _path(request, caller, message.get("path"))
    if path == "/":
        raise InvalidPath("the sandbox's root cannot be removed")
    await node.remove(caller.sandbox_id, path, user=run_as(request))
    return connect.unary_response({})


def _fs_event(event: FsEvent) -> Message:
    return {"name": event.name, "type": f"EVENT_TYPE_{event.type.value.upper()}"}


def _watched(request: Request, caller: SandboxCaller, message: Message) -> str:
    if message.get("recursive"):
        raise NotSupported("recursive watching is not supported by Corral")
    return _path(request, caller, message.get("path"))


async def fs_create_watcher(request: Request) -> Response:
    caller, node = await _node(request)
    message = await connect.unary_request(request)
    path = _watched(request, caller, message)
    watcher_id = await node.watch(caller.sandbox_id, path, user=run_as(request))
    return connect.unary_response({"watcherId": watcher_id})


async def fs_watcher_events(request: Request) -> Response:
    caller, node = await _node(request)
    message = await connect.unary_request(request)
    got = await node.watch_events(caller.sandbox_id, str(message.get("watcherId") or "-"))
    return connect.unary_response({"events": [_fs_event(e) for e in got.events]})


async def fs_remove_watcher(request: Request) -> Response:
    caller, node = await _node(request)
    message = await connect.unary_request(request)
    await node.unwatch(caller.sandbox_id, str(message.get("watcherId") or "-"))
    return connect.unary_response({})


async def fs_watch_dir(request: Request) -> Response:
    try:
        caller, node = await _node(request)
        message = await connect.first_request(request)
        path = _watched(request, caller, message)
        watcher_id = await node.watch(caller.sandbox_id, path, user=run_as(request))
    except Exception as exc:
        return connect.stream_error(exc)
    return connect.stream_response(
        _watch(node, caller.sandbox_id, watcher_id, _keepalive_s(request))
    )


async def _watch(
    node: NodeClient, sandbox_id: str, watcher_id: str, keepalive_s: float
) -> AsyncIterator[Message]:
    """A watcher's events as envd's stream (the node is polled every ``WATCH_POLL_S``);
    the watcher goes when the stream does."""
    try:
        yield {"start": {}}
        quiet = 0.0
        while True:
            got = await node.watch_events(sandbox_id, watcher_id)
            for event in got.events:
                yield {"filesystem": _fs_event(event)}
            if got.ended:
                return
            quiet = 0.0 if got.events else quiet + WATCH_POLL_S
            if quiet >= keepalive_s:
                yield {"keepalive": {}}
                quiet = 0.0
            await asyncio.sleep(WATCH_POLL_S)
    finally:
        with contextlib.suppress(Exception):
            await node.unwatch(sandbox_id, watcher_id)


# --- envd HTTP --------------------------------------------------------------------------
async def files_get(request: Request) -> Response:
    caller, node = await _node(request)
    path = _path(request, caller, request.query_params.get("path"))
    file = await node.read_file(
        caller.sandbox_id, path, user=_user(request), max_bytes=file_limit(request)
    )
    return FileAnswer(file, idle_s=transfer_idle(request))


async def _upload(
    node: NodeClient,
    caller: SandboxCaller,
    path: str,
    user: str | None,
    chunks: AsyncIterator[bytes],
    limit: int,
) -> Message:
    entry = await node.write_file(
        caller.sandbox_id, path, bounded(chunks, limit), user=user, mode=None
    )
    return {"name": entry.name, "type": entry.type.value, "path": entry.path}


async def files_post(request: Request) -> Response:
    """An upload, octet-stream or multipart: each file streamed to the node as its bytes
    arrive (one file at a time, none held whole)."""
    caller, node = await _node(request)
    user = _user(request)
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if request.headers.get("content-encoding", "identity") != "identity":
        raise NotSupported("compressed uploads are not supported by Corral")
    limit = file_limit(request)  # each file's (a multipart body may carry several)
    if kind != "multipart/form-data":
        refuse_declared_over(request, limit)
        path = _path(request, caller, request.query_params.get("path"))
        return JSONResponse([await _upload(node, caller, path, user, upload_body(request), limit)])
    written: list[Message] = []
    body = MultipartFiles(request, upload_body(request))
    async for part in body.parts():
        if part.filename is None:
            continue  # a form field, not a file
        name = request.query_params.get("path") or part.filename
        path = _path(request, caller, name)
        written.append(await _upload(node, caller, path, user, body.data(), limit))
    if not written:
        raise BadRequest("the upload carries no file")
    return JSONResponse(written)


async def health(request: Request) -> Response:
    caller = await sandbox_caller(request)
    await services(request).sandboxes.node_of(caller.row)  # a stopped one: 502
    if caller.row.state != "running":
        raise SandboxGone(f"sandbox {caller.sandbox_id} was not found running")
    return Response(status_code=204)


def routes() -> list[Route]:
    rpc: list[tuple[str, Handler]] = [
        ("/process.Process/List", process_list),
        ("/process.Process/SendSignal", process_signal),
        ("/process.Process/SendInput", process_send_input),
        ("/process.Process/CloseStdin", process_close_stdin),
        ("/process.Process/Update", process_update),
        ("/filesystem.Filesystem/Stat", fs_stat),
        ("/filesystem.Filesystem/ListDir", fs_list),
        ("/filesystem.Filesystem/MakeDir", fs_make_dir),
        ("/filesystem.Filesystem/Move", fs_move),
        ("/filesystem.Filesystem/Remove", fs_remove),
        ("/filesystem.Filesystem/CreateWatcher", fs_create_watcher),
        ("/filesystem.Filesystem/GetWatcherEvents", fs_watcher_events),
        ("/filesystem.Filesystem/RemoveWatcher", fs_remove_watcher),
    ]
    streams: list[tuple[str, Handler]] = [
        ("/process.Process/Start", process_start),
        ("/process.Process/Connect", process_connect),
        ("/process.Process/StreamInput", process_stream_input),
        ("/filesystem.Filesystem/WatchDir", fs_watch_dir),
    ]
    return [
        *(Route(p, guarded(h, connect_unary_error), methods=["POST"]) for p, h in rpc),
        *(Route(p, guarded(h, connect.stream_error), methods=["POST"]) for p, h in streams),
        Route("/files", guarded(files_get, rest_error), methods=["GET"]),
        Route("/files", guarded(files_post, rest_error), methods=["POST"]),
        Route("/health", guarded(health, rest_error), methods=["GET"]),
    ]
