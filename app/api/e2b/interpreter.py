"""The code interpreter's port (49999): ``/execute`` and ``/contexts``.

A context is a worker process inside the sandbox (``app.api.e2b.guest_worker``, written into the
sandbox through the file API when a worker starts, never baked into an image), started
through the node's process table with stdin open and tagged ``corral:interpreter:<id>``,
so any gateway finds it by listing the sandbox's processes. The default context starts
at the first ``/execute`` without a ``context_id``.

``/execute`` follows the worker's output, writes the cell to its stdin as a JSON line and
streams the worker's answer lines for that cell, in the SDK's shapes, until its ``end``.
If the client goes away before (its ``timeout`` ran out), the cell is interrupted
(SIGINT: a ``KeyboardInterrupt`` in the cell; the context keeps its state); a cell that
does not stop within ``INTERRUPT_GRACE_S`` has its worker killed, and the context
starts again empty at its next use. A worker that dies mid-cell answers an error
(``WorkerDied``). Python only. A cell, and a context's start, run only within the
tenant's daily CPU budget (else 429 ``cpu_quota_exhausted``).
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import json
import logging
import secrets
import signal
import uuid
import weakref
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.api.e2b import connect
from app.api.e2b.auth import SandboxCaller, home_of, sandbox_caller, services
from app.api.e2b.envd import INTERNAL_TAG, PROCESS_OUTPUT_BYTES
from app.api.e2b.errors import Handler, NotSupported, guarded, interpreter_error
from app.errors import BadRequest, CorralError, NotFound
from app.sandboxes.nodes import NodeClient
from common.logsafe import loggable
from wire.processes import ProcessInfo, StartProcess
from wire.sandboxes import ExecEvent, ExecExit, ExecOutput, ExecRequest, ExecStarted

log = logging.getLogger(__name__)

WORKER_PATH = "/opt/corral/interpreter.py"
TAG = INTERNAL_TAG + "interpreter:"
DEFAULT_CONTEXT = "default"
LANGUAGES = {None, "python", "python3"}
INTERRUPT_GRACE_S = 3.0
#: how long a killed worker may take to leave the process table
END_WAIT_S = 5.0
MAX_BODY_BYTES = 4 << 20

_starting: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
    weakref.WeakValueDictionary()
)
_interrupts: set[asyncio.Task[None]] = set()


@functools.cache
def worker_source() -> bytes:
    return resources.files("app.api.e2b").joinpath("guest_worker.py").read_bytes()


async def _json(request: Request) -> dict[str, Any]:
    return await connect.json_body(request, limit=MAX_BODY_BYTES)


async def _node(request: Request) -> tuple[SandboxCaller, NodeClient]:
    caller = await sandbox_caller(request)
    return caller, await services(request).sandboxes.node_of(caller.row)


async def _node_to_run(request: Request) -> tuple[SandboxCaller, NodeClient]:
    """As ``_node``, for a call that runs code: within the tenant's daily CPU budget."""
    caller, node = await _node(request)
    await services(request).sandboxes.admission.cpu(caller.principal)
    return caller, node


def _home(caller: SandboxCaller) -> str:
    return home_of(None, str((caller.row.spec or {}).get("user") or "user"))


async def _workers(node: NodeClient, sandbox_id: str) -> dict[str, ProcessInfo]:
    found: dict[str, ProcessInfo] = {}
    for p in sorted(await node.processes(sandbox_id), key=lambda p: p.pid):
        if p.tag is not None and p.tag.startswith(TAG):
            found.setdefault(p.tag.removeprefix(TAG), p)
    return found


async def end_worker(node: NodeClient, sandbox_id: str, context_id: str, pid: int) -> None:
    """Kill a context's worker and wait (at most ``END_WAIT_S``) until it has left the
    sandbox's process table, so a list right after a remove, or a restart's new worker,
    never finds the old one."""
    await node.signal_process(sandbox_id, pid, signal.SIGKILL)
    deadline = asyncio.get_running_loop().time() + END_WAIT_S
    while (found := (await _workers(node, sandbox_id)).get(context_id)) and found.pid == pid:
        if asyncio.get_running_loop().time() >= deadline:
            log.warning("sandbox=%s: context %s's worker outlived its kill", sandbox_id, context_id)
            return
        await asyncio.sleep(0.02)


async def _start_worker(node: NodeClient, sandbox_id: str, context_id: str, cwd: str) -> int:
    await node.write_file(sandbox_id, WORKER_PATH, worker_source(), user="root", mode=0o644)
    request = ExecRequest(
        cmd=["python3", "-u", WORKER_PATH, context_id],
        cwd=cwd,
        stdin_open=True,
        timeout_s=None,
        max_output_bytes=PROCESS_OUTPUT_BYTES,
    )
    events = node.start_process(sandbox_id, StartProcess(request=request, tag=TAG + context_id))
    try:
        first = await anext(events)
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    if not isinstance(first, ExecStarted):
        raise CorralError("the interpreter's worker did not start")
    log.info(
        "sandbox=%s: interpreter context %s started (pid %d)",
        sandbox_id,
        loggable(context_id),
        first.pid,
    )
    return first.pid


def _context(info: ProcessInfo, context_id: str) -> dict[str, str]:
    return {"id": context_id, "language": "python", "cwd": info.cwd or "/"}


async def _answers(events: AsyncIterator[ExecEvent], cell: str) -> AsyncIterator[dict[str, Any]]:
    """The worker's answers to one cell, until its ``end`` (excluded)."""
    pending = ""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")  # a line may span two reads
    async for event in events:
        if isinstance(event, ExecExit):
            yield {
                "type": "error",
                "name": "WorkerDied",
                "value": "the context's worker ended; its state is lost",
                "traceback": "",
            }
            return
        if not isinstance(event, ExecOutput):
            continue
        if event.stream == "stderr":
            log.debug("interpreter worker: %s", loggable(event.data.decode(errors="replace")))
            continue
        pending += decoder.decode(event.data)
        *lines, pending = pending.split("\n")
        for line in lines:
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            if not isinstance(answer, dict) or answer.pop("id", None) != cell:
                continue
            if answer.get("type") == "end":
                return
            yield answer


async def _interrupt(
    node: NodeClient, sandbox_id: str, context_id: str, pid: int, cell: str
) -> None:
    """Stop a cell its client no longer waits for: SIGINT, then SIGKILL the worker."""
    try:
        events = node.follow_process(sandbox_id, pid)
        await anext(events)
        await node.signal_process(sandbox_id, pid, signal.SIGINT)
        try:
            async with asyncio.timeout(INTERRUPT_GRACE_S):
                async for _ in _answers(events, cell):
                    pass
            log.info("sandbox=%s: interpreter cell %s interrupted", sandbox_id, cell)
        except TimeoutError:
            log.warning(
                "sandbox=%s: cell %s ignored SIGINT; its context is reset", sandbox_id, cell
            )
            await end_worker(node, sandbox_id, context_id, pid)
        finally:
            await events.aclose()  # type: ignore[attr-defined]
    except (CorralError, StopAsyncIteration) as exc:
        log.info("sandbox=%s: cell %s: nothing to interrupt (%s)", sandbox_id, cell, loggable(exc))


async def execute(request: Request) -> Response:
    caller, node = await _node_to_run(request)
    body = await _json(request)
    code = body.get("code")
    if not isinstance(code, str):
        raise BadRequest("code is required")
    if body.get("language") not in LANGUAGES:
        raise NotSupported(f"language {body.get('language')!r} is not supported (python only)")
    env = body.get("env_vars") or {}
    if not isinstance(env, dict):
        raise BadRequest("env_vars must be an object")
    context_id = str(body.get("context_id") or DEFAULT_CONTEXT)
    sandbox_id = caller.sandbox_id
    lock = _starting.setdefault((sandbox_id, context_id), asyncio.Lock())
    async with lock:
        worker = (await _workers(node, sandbox_id)).get(context_id)
        if worker is not None:
            pid = worker.pid
        elif context_id == DEFAULT_CONTEXT:
            pid = await _start_worker(node, sandbox_id, context_id, _home(caller))
        else:
            raise NotFound(f"no context {context_id}")
    events = node.follow_process(sandbox_id, pid)
    await anext(events)  # following before the cell is sent: none of its output is missed
    cell = secrets.token_hex(8)
    line = {"id": cell, "code": code, "env_vars": {str(k): str(v) for k, v in env.items()}}
    await node.write_stdin(sandbox_id, pid, json.dumps(line).encode() + b"\n")

    async def stream() -> AsyncIterator[bytes]:
        done = False
        try:
            async for answer in _answers(events, cell):
                yield json.dumps(answer).encode() + b"\n"
            done = True
        finally:
            if not done:
                task = asyncio.create_task(_interrupt(node, sandbox_id, context_id, pid, cell))
                _interrupts.add(task)
                task.add_done_callback(_interrupts.discard)

    return StreamingResponse(stream(), media_type="application/x-ndjson")


async def create_context(request: Request) -> Response:
    caller, node = await _node_to_run(request)
    body = await _json(request)
    if body.get("language") not in LANGUAGES:
        raise NotSupported(f"language {body.get('language')!r} is not supported (python only)")
    cwd = body.get("cwd") or _home(caller)
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        raise BadRequest("cwd must be an absolute path")
    context_id = uuid.uuid4().hex
    await _start_worker(node, caller.sandbox_id, context_id, cwd)
    return JSONResponse({"id": context_id, "language": "python", "cwd": cwd})


async def list_contexts(request: Request) -> Response:
    caller, node = await _node(request)
    workers = await _workers(node, caller.sandbox_id)
    return JSONResponse([_context(info, cid) for cid, info in workers.items()])


async def _worker(request: Request) -> tuple[SandboxCaller, NodeClient, str, ProcessInfo]:
    caller, node = await _node(request)
    context_id = str(request.path_params["context_id"])
    worker = (await _workers(node, caller.sandbox_id)).get(context_id)
    if worker is None:
        raise NotFound(f"no context {context_id}")
    return caller, node, context_id, worker


async def remove_context(request: Request) -> Response:
    caller, node, context_id, worker = await _worker(request)
    await end_worker(node, caller.sandbox_id, context_id, worker.pid)
    log.info("sandbox=%s: interpreter context %s removed", caller.sandbox_id, loggable(context_id))
    return Response(status_code=204)


async def restart_context(request: Request) -> Response:
    caller, node, context_id, worker = await _worker(request)
    await services(request).sandboxes.admission.cpu(caller.principal)
    await end_worker(node, caller.sandbox_id, context_id, worker.pid)
    await _start_worker(node, caller.sandbox_id, context_id, worker.cwd or _home(caller))
    return Response(status_code=204)


def routes() -> list[Route]:
    table: list[tuple[str, Handler, list[str]]] = [
        ("/execute", execute, ["POST"]),
        ("/contexts", create_context, ["POST"]),
        ("/contexts", list_contexts, ["GET"]),
        ("/contexts/{context_id}", remove_context, ["DELETE"]),
        ("/contexts/{context_id}/restart", restart_context, ["POST"]),
    ]
    return [Route(p, guarded(h, interpreter_error), methods=m) for p, h, m in table]
