"""``/v1/sandboxes``: stateful sandboxes, scoped to the calling tenant.

Every operation on a sandbox is routed to the node that holds it
(``app.sandboxes.service``). Files travel as raw bytes, streamed both ways (``GET``/``PUT
.../files``), and every file call acts as a user of the sandbox (its default, or ``user``);
``exec`` answers the whole result, or NDJSON events as they come with ``"stream": true``;
its output as text, and as exact bytes where text would not carry them
(``app.sandboxes.output``).
Every call here takes a token of the tenant's sandbox-calls bucket first
(``app.sandboxes.admission``: 429 ``rate_limited`` past ``sandbox_calls_per_second``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from pydantic import BaseModel
from starlette.responses import Response, StreamingResponse

from app.db.cursors import decode_cursor, encode_cursor
from app.db.models import Sandbox, Snapshot
from app.errors import InvalidPath, ValidationFailed
from app.http.endpoint import Call, Endpoint, Handler, endpoint
from app.sandboxes import listing, output
from app.sandboxes.files import (
    FileAnswer,
    bounded,
    file_limit,
    refuse_declared_over,
    transfer_idle,
    upload_body,
)
from app.schemas.sandboxes import (
    CreateSandbox,
    EntryList,
    ExecBody,
    ExecOut,
    ForkBody,
    ForkOut,
    ListQuery,
    MoveBody,
    PathBody,
    PathQuery,
    SandboxList,
    SandboxOut,
    SandboxQuery,
    SnapshotList,
    SnapshotOut,
    SnapshotQuery,
    TimeoutBody,
    Timings,
)
from wire.sandboxes import ExecRequest, FileEntry, NetworkPolicy, collect

TAGS = ["sandboxes"]
ONE = "/v1/sandboxes/{sandbox_id}"
#: the most an exec answer keeps per stream (a stream can be followed with "stream": true)
EXEC_OUTPUT_CAP = 4 << 20


def sandbox_out(row: Sandbox) -> SandboxOut:
    spec = row.spec or {}
    return SandboxOut(
        id=row.id,
        backend=row.backend,
        image=row.image,
        image_digest=row.image_digest,
        state=row.state,
        node_id=row.node_id,
        cpu=float(spec.get("cpu", 1.0)),
        memory_mb=int(spec.get("memory_mb", 0)),
        disk_mb=int(spec.get("disk_mb", 0)),
        network=NetworkPolicy.model_validate(spec.get("network") or "none"),
        created_at=row.created_at,
        started_at=row.started_at,
        expires_at=row.expires_at,
        ended_at=row.ended_at,
        reason=row.reason,
        metadata=row.meta or {},
        timings=Timings(
            queue_ms=row.queue_ms,
            image_ms=row.image_ms,
            setup_ms=row.setup_ms,
            start_ms=row.start_ms,
        ),
        cpu_ms=row.cpu_ms,
        memory_bytes=row.memory_bytes,
        accelerator=row.accelerator,
    )


@endpoint(
    "POST",
    "/v1/sandboxes",
    summary="Create a sandbox",
    tags=TAGS,
    body=CreateSandbox,
    response=SandboxOut,
    status=201,
    errors=(404, 429),
)
async def create_sandbox(call: Call) -> SandboxOut:
    return sandbox_out(await call.services.sandboxes.create(call.tenant, call.body))


@endpoint(
    "GET",
    "/v1/sandboxes",
    summary="The tenant's sandboxes, newest first; filters, and metadata.KEY=VALUE",
    tags=TAGS,
    query=SandboxQuery,
    response=SandboxList,
)
async def list_sandboxes(call: Call) -> SandboxList:
    q: SandboxQuery = call.query
    for name in call.request.query_params:
        if len(call.request.query_params.getlist(name)) > 1:
            raise ValidationFailed(f"query parameter {name} is given more than once")
    filters = listing.Filters(
        states=listing.states(q.state), backend=q.backend, image=q.image, metadata=q.metadata
    )
    rows = await call.services.sandboxes.list_sandboxes(
        call.tenant.tenant_id,
        filters,
        limit=q.limit,
        after=decode_cursor(q.cursor) if q.cursor else None,
    )
    return SandboxList(
        sandboxes=[sandbox_out(r) for r in rows],
        next_cursor=encode_cursor(rows[-1]) if len(rows) == q.limit else None,
    )


@endpoint("GET", ONE, summary="One sandbox", tags=TAGS, response=SandboxOut)
async def get_sandbox(call: Call) -> SandboxOut:
    row = await call.services.sandboxes.refresh(call.tenant.tenant_id, call.path["sandbox_id"])
    return sandbox_out(row)


@endpoint("DELETE", ONE, summary="Destroy a sandbox", tags=TAGS, response=SandboxOut)
async def delete_sandbox(call: Call) -> SandboxOut:
    row = await call.services.sandboxes.destroy(call.tenant.tenant_id, call.path["sandbox_id"])
    return sandbox_out(row)


def _action(name: str, summary: str) -> Endpoint:
    async def handler(call: Call) -> SandboxOut:
        row = await call.services.sandboxes.action(call.tenant, call.path["sandbox_id"], name)
        return sandbox_out(row)

    handler.__name__ = f"{name}_sandbox"
    return endpoint("POST", f"{ONE}/{name}", summary=summary, tags=TAGS, response=SandboxOut)(
        handler
    )


pause_sandbox = _action("pause", "Freeze every process of a sandbox")
resume_sandbox = _action("resume", "Thaw a paused sandbox")


@endpoint(
    "POST",
    f"{ONE}/timeout",
    summary="End the sandbox this long from now (within its lifetime quota)",
    tags=TAGS,
    body=TimeoutBody,
    response=SandboxOut,
)
async def set_timeout(call: Call) -> SandboxOut:
    body: TimeoutBody = call.body
    sandboxes = call.services.sandboxes
    row = await sandboxes.set_timeout(call.tenant, call.path["sandbox_id"], body.ttl_s)
    return sandbox_out(row)


@endpoint(
    "POST",
    f"{ONE}/exec",
    summary="Run a command in the sandbox",
    tags=TAGS,
    body=ExecBody,
    response=ExecOut,
    stream=(
        "application/x-ndjson",
        'with "stream": true: one JSON event per line (started, output, exit) as they come',
    ),
)
async def exec_command(call: Call) -> ExecOut | Response:
    body: ExecBody = call.body
    request = ExecRequest(
        cmd=body.argv(),
        env=body.env,
        cwd=body.cwd,
        user=body.user,
        stdin=body.stdin,
        timeout_s=body.timeout_s,
        max_output_bytes=EXEC_OUTPUT_CAP,
    )
    events = await call.services.sandboxes.exec(call.tenant, call.path["sandbox_id"], request)
    if body.stream:
        # The node's refusal (paused, gone, unreachable) comes with the first event: take
        # it before the answer starts, so that it is an error answer, not a cut stream.
        answer = output.stream_events(events, binary=body.binary)
        first = await anext(answer, None)

        async def lines() -> AsyncIterator[bytes]:
            if first is not None:
                yield output.ndjson_line(first)
            async for event in answer:
                yield output.ndjson_line(event)

        return StreamingResponse(lines(), media_type="application/x-ndjson")
    return output.exec_out(await collect(events), binary=body.binary)


@endpoint(
    "GET",
    f"{ONE}/files",
    summary="Download a file (raw bytes, streamed), read as the user named",
    tags=TAGS,
    query=PathQuery,
)
async def read_file(call: Call) -> Response:
    q: PathQuery = call.query
    node = await call.services.sandboxes.node_for(call.tenant.tenant_id, call.path["sandbox_id"])
    file = await node.read_file(
        call.path["sandbox_id"], q.path, user=q.user, max_bytes=file_limit(call.request)
    )
    return FileAnswer(file, idle_s=transfer_idle(call.request))


@endpoint(
    "PUT",
    f"{ONE}/files",
    summary="Upload a file (the body is its bytes, streamed; up to max_file_bytes, not "
    "the body cap), written as the user named",
    tags=TAGS,
    query=PathQuery,
    response=FileEntry,
)
async def write_file(call: Call) -> FileEntry:
    q: PathQuery = call.query
    limit = file_limit(call.request)
    refuse_declared_over(call.request, limit)
    node = await call.services.sandboxes.node_for(call.tenant.tenant_id, call.path["sandbox_id"])
    mode = int(q.mode, 8) if q.mode else None
    chunks = bounded(upload_body(call.request), limit)
    return await node.write_file(call.path["sandbox_id"], q.path, chunks, user=q.user, mode=mode)


@endpoint(
    "GET",
    f"{ONE}/files/stat",
    summary="A file's metadata",
    tags=TAGS,
    query=PathQuery,
    response=FileEntry,
)
async def stat_file(call: Call) -> FileEntry:
    q: PathQuery = call.query
    node = await call.services.sandboxes.node_for(call.tenant.tenant_id, call.path["sandbox_id"])
    return await node.stat(call.path["sandbox_id"], q.path, user=q.user)


@endpoint(
    "GET",
    f"{ONE}/files/list",
    summary="A directory's entries, a page at a time (next_cursor asks for the next)",
    tags=TAGS,
    query=ListQuery,
    response=EntryList,
)
async def list_files(call: Call) -> EntryList:
    q: ListQuery = call.query
    node = await call.services.sandboxes.node_for(call.tenant.tenant_id, call.path["sandbox_id"])
    page = await node.list_dir(
        call.path["sandbox_id"],
        q.path,
        depth=q.depth,
        user=q.user,
        limit=q.limit,
        cursor=q.cursor,
    )
    return EntryList(entries=page.entries, next_cursor=page.next_cursor)


@endpoint(
    "POST",
    f"{ONE}/files/mkdir",
    summary="Make a directory and its parents",
    tags=TAGS,
    body=PathBody,
    response=FileEntry,
)
async def make_dir(call: Call) -> FileEntry:
    body: PathBody = call.body
    node = await call.services.sandboxes.node_for(call.tenant.tenant_id, call.path["sandbox_id"])
    return await node.make_dir(call.path["sandbox_id"], body.path, user=body.user)


@endpoint(
    "POST",
    f"{ONE}/files/remove",
    summary="Remove a file or a directory tree",
    tags=TAGS,
    body=PathBody,
    status=204,
)
async def remove_file(call: Call) -> Response:
    body: PathBody = call.body
    if body.path.strip() in ("/", ""):
        raise InvalidPath("the sandbox's root cannot be removed")
    node = await call.services.sandboxes.node_for(call.tenant.tenant_id, call.path["sandbox_id"])
    await node.remove(call.path["sandbox_id"], body.path, user=body.user)
    return Response(status_code=204)


@endpoint(
    "POST",
    f"{ONE}/files/move",
    summary="Move or rename",
    tags=TAGS,
    body=MoveBody,
    response=FileEntry,
)
async def move_file(call: Call) -> FileEntry:
    body: MoveBody = call.body
    node = await call.services.sandboxes.node_for(call.tenant.tenant_id, call.path["sandbox_id"])
    return await node.move(call.path["sandbox_id"], body.source, body.destination, user=body.user)


def snapshot_out(row: Snapshot) -> SnapshotOut:
    return SnapshotOut(
        id=row.id,
        sandbox_id=row.sandbox_id,
        backend=row.backend,
        image=row.image,
        image_digest=row.image_digest,
        node_id=row.node_id,
        size_bytes=row.size_bytes,
        created_at=row.created_at,
    )


@endpoint(
    "POST",
    f"{ONE}/snapshot",
    summary="Snapshot the sandbox: a container's files (not its processes), a microVM's whole "
    "machine (memory and processes too)",
    tags=TAGS,
    response=SnapshotOut,
    status=201,
)
async def snapshot_sandbox(call: Call) -> SnapshotOut:
    row = await call.services.sandboxes.snapshot(call.tenant, call.path["sandbox_id"])
    return snapshot_out(row)


@endpoint(
    "POST",
    f"{ONE}/fork",
    summary="Branch the sandbox into N new ones from one snapshot of it (a microVM's run on "
    "with its processes)",
    tags=TAGS,
    body=ForkBody,
    response=ForkOut,
    status=201,
    errors=(429,),
)
async def fork_sandbox(call: Call) -> ForkOut:
    body: ForkBody = call.body
    snapshot, rows = await call.services.sandboxes.fork(
        call.tenant,
        call.path["sandbox_id"],
        count=body.count,
        ttl_s=body.ttl_s,
        metadata=body.metadata,
    )
    return ForkOut(snapshot=snapshot_out(snapshot), sandboxes=[sandbox_out(r) for r in rows])


@endpoint(
    "GET",
    "/v1/snapshots",
    summary="The tenant's snapshots",
    tags=TAGS,
    query=SnapshotQuery,
    response=SnapshotList,
)
async def list_snapshots(call: Call) -> SnapshotList:
    q: SnapshotQuery = call.query
    rows = await call.services.sandboxes.list_snapshots(call.tenant.tenant_id, limit=q.limit)
    return SnapshotList(snapshots=[snapshot_out(r) for r in rows])


@endpoint(
    "DELETE",
    "/v1/snapshots/{snapshot_id}",
    summary="Delete a snapshot",
    tags=TAGS,
    status=204,
)
async def delete_snapshot(call: Call) -> Response:
    await call.services.sandboxes.delete_snapshot(call.tenant.tenant_id, call.path["snapshot_id"])
    return Response(status_code=204)


endpoints = [
    create_sandbox,
    list_sandboxes,
    get_sandbox,
    delete_sandbox,
    pause_sandbox,
    resume_sandbox,
    set_timeout,
    exec_command,
    read_file,
    write_file,
    stat_file,
    list_files,
    make_dir,
    remove_file,
    move_file,
    snapshot_sandbox,
    fork_sandbox,
    list_snapshots,
    delete_snapshot,
]

#: what each operation can answer beyond the statuses every tenant endpoint has: 409 for a
#: paused or stopped sandbox (or a snapshot in use), 400/413 for paths and file sizes, 403
#: for what the user a file call acts as may not do, 429 past the node's transfer bounds,
#: 507 for a full disk
_ERRORS: dict[str, tuple[int, ...]] = {
    "create_sandbox": (404, 409, 422, 429),
    "pause_sandbox": (409,),
    "resume_sandbox": (409, 429),
    "set_timeout": (409,),
    "exec_command": (409, 429),
    "read_file": (400, 403, 409, 413, 429),
    "write_file": (400, 403, 409, 413, 429, 507),
    "stat_file": (400, 403, 409),
    "list_files": (400, 403, 409, 429),
    "make_dir": (400, 403, 409, 507),
    "remove_file": (400, 403, 409),
    "move_file": (400, 403, 409, 507),
    "snapshot_sandbox": (409, 429),
    "fork_sandbox": (409, 422, 429),
    "delete_snapshot": (409,),
}


def _charged(handler: Handler) -> Handler:
    """``handler`` after a token of the tenant's sandbox-calls bucket."""

    async def charged(call: Call) -> BaseModel | Response | None:
        await call.services.sandboxes.admission.call(call.tenant)
        return await handler(call)

    charged.__name__ = handler.__name__
    charged.__doc__ = handler.__doc__
    return charged


for _endpoint in endpoints:
    _extra = _ERRORS.get(_endpoint.handler.__name__, ())
    _endpoint.errors = tuple(sorted({*_endpoint.errors, *_extra, 429}))  # 429: rate_limited
    _endpoint.handler = _charged(_endpoint.handler)
