"""Liveness, readiness, metrics and the API document."""

from __future__ import annotations

import asyncio
import logging

from pydantic import BaseModel, Field
from sqlalchemy import text
from starlette.responses import JSONResponse, Response

from app.db.migrate import schema_state
from app.http.endpoint import Call, endpoint

log = logging.getLogger(__name__)

_READY_TIMEOUT_S = 2.0


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    database: bool
    schema_: bool = Field(
        alias="schema",
        description="The schema is at this release's head, or ahead of it (a newer release "
        "migrated it): never behind, never empty.",
    )
    dispatch: bool
    nodes: int


@endpoint(
    "GET", "/healthz", summary="The process is alive", tags=["ops"], auth="none", response=Health
)
async def healthz(call: Call) -> Health:
    return Health(status="ok")


@endpoint(
    "GET",
    "/readyz",
    summary="Database (at the right schema) and dispatch are reachable",
    tags=["ops"],
    auth="none",
    response=Readiness,
)
async def readyz(call: Call) -> Response:
    services = call.services
    database = await _check(_database_ok(call))
    schema = database and await _check(_schema_usable(call))
    dispatch = await _check(services.transport.ready())
    nodes = len(await services.transport.catalogue()) if dispatch else 0
    ready = database and schema and dispatch
    body = Readiness(
        status="ready" if ready else "unavailable",
        database=database,
        schema=schema,
        dispatch=dispatch,
        nodes=nodes,
    )
    return JSONResponse(body.model_dump(by_alias=True), status_code=200 if ready else 503)


@endpoint("GET", "/metrics", summary="Prometheus metrics", tags=["ops"], auth="none")
async def metrics(call: Call) -> Response:
    await call.services.refresh_gauges()
    return Response(
        call.services.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
    )


@endpoint("GET", "/openapi.json", summary="This API's OpenAPI document", tags=["ops"], auth="none")
async def openapi(call: Call) -> Response:
    return JSONResponse(call.request.app.state.openapi)


async def _database_ok(call: Call) -> bool:
    async with call.services.engine.connect() as conn:
        await conn.execute(text("SELECT 1"))
    return True


async def _schema_usable(call: Call) -> bool:
    return (await schema_state(call.services.engine)).usable


async def _check(probe: object) -> bool:
    try:
        return bool(await asyncio.wait_for(probe, _READY_TIMEOUT_S))  # type: ignore[arg-type]
    except Exception as exc:
        log.warning("readiness probe failed: %r", exc)
        return False


endpoints = [healthz, readyz, metrics, openapi]
