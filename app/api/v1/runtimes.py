"""``GET /v1/runtimes``: what the live nodes can run."""

from __future__ import annotations

from pydantic import BaseModel

from app.http.endpoint import Call, endpoint


class RuntimeLanguage(BaseModel):
    language: str
    runtime: str


class RuntimeList(BaseModel):
    languages: list[RuntimeLanguage]
    nodes: int


@endpoint(
    "GET",
    "/v1/runtimes",
    summary="Languages the live nodes offer",
    tags=["run"],
    response=RuntimeList,
)
async def list_runtimes(call: Call) -> RuntimeList:
    catalogue = call.services.catalogue
    nodes = await catalogue.nodes()
    offered = catalogue.languages(nodes)
    return RuntimeList(
        languages=[RuntimeLanguage(language=k, runtime=v) for k, v in sorted(offered.items())],
        nodes=len(nodes),
    )


endpoints = [list_runtimes]
