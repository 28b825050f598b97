"""The operator's views of the gateway itself: what the recorder could not store, and the
leader's jobs."""

from __future__ import annotations

from app.db import dead_letters
from app.http.endpoint import Call, endpoint
from app.schemas.admin import (
    DeadLetterList,
    DeadLetterOut,
    DeadLetterQuery,
    LeaderJobOut,
    LeaderOut,
)

TAGS = ["admin"]


@endpoint(
    "GET",
    "/v1/admin/dead-letters",
    summary="List node results the recorder could not store (newest first)",
    tags=TAGS,
    auth="admin",
    query=DeadLetterQuery,
    response=DeadLetterList,
)
async def list_dead_letters(call: Call) -> DeadLetterList:
    query: DeadLetterQuery = call.query
    async with call.services.sessions() as session:
        rows = await dead_letters.recent(session, limit=query.limit, before=query.before)
    return DeadLetterList(dead_letters=[DeadLetterOut.model_validate(r) for r in rows])


@endpoint(
    "GET",
    "/v1/admin/leader",
    summary="The leader's jobs as this gateway runs them: period, runs, last duration, error",
    tags=TAGS,
    auth="admin",
    response=LeaderOut,
)
async def leader(call: Call) -> LeaderOut:
    services = call.services
    return LeaderOut(
        gateway_id=services.transport.gateway_id,
        leading=services.leader.leading,
        jobs=[LeaderJobOut.model_validate(s) for s in services.leader.status.values()],
    )


endpoints = [list_dead_letters, leader]
