"""Invocation history, scoped to the calling tenant."""

from __future__ import annotations

from app.api.v1.present import invocation_out
from app.db import invocations as repo
from app.db.cursors import decode_cursor, encode_cursor
from app.http.endpoint import Call, endpoint
from app.invocations import projection
from app.schemas.invocations import InvocationList, InvocationOut, InvocationQuery

TAGS = ["invocations"]


@endpoint(
    "GET",
    "/v1/invocations/{invocation_id}",
    summary="One invocation and its result",
    tags=TAGS,
    response=InvocationOut,
)
async def get_invocation(call: Call) -> InvocationOut:
    async with call.services.sessions() as session:
        row = await repo.get(
            session, tenant_id=call.tenant.tenant_id, invocation_id=call.path["invocation_id"]
        )
    return invocation_out(row, await projection.load(call.services.sessions, row))


@endpoint(
    "GET",
    "/v1/invocations",
    summary="Recent invocations, newest first",
    tags=TAGS,
    query=InvocationQuery,
    response=InvocationList,
)
async def list_invocations(call: Call) -> InvocationList:
    q: InvocationQuery = call.query
    async with call.services.sessions() as session:
        rows = await repo.list_for_tenant(
            session,
            tenant_id=call.tenant.tenant_id,
            limit=q.limit,
            status=q.status,
            kind=q.kind,
            language=q.language,
            before=q.before,
            after_row=decode_cursor(q.cursor) if q.cursor else None,
        )
    return InvocationList(
        invocations=[invocation_out(r, projection.preview(r)) for r in rows],
        next_cursor=encode_cursor(rows[-1]) if len(rows) == q.limit else None,
    )


endpoints = [get_invocation, list_invocations]
