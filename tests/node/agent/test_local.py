"""A node's app called in its own process (``node.agent.local``): the same request and
answer as over its socket, streamed both ways, bounded, timed out and ended with the
client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.sandboxes.nodes import NodeClient
from node.agent import local
from wire.sandboxes import SandboxInventory

ADDRESS = "unix:/nonexistent/corral-test/node.sock"  # no socket: only this process answers


class Probe:
    """What the app saw: the streamed answer's progress and how it ended."""

    def __init__(self) -> None:
        self.sent = 0
        self.second = asyncio.Event()
        self.ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()


def app_with(probe: Probe) -> Starlette:
    async def echo(request: Request) -> Response:
        body = b"".join([chunk async for chunk in request.stream()])
        return JSONResponse(
            {
                "method": request.method,
                "path": request.url.path,
                "query": dict(request.query_params),
                "auth": request.headers.get("authorization"),
                "body": body.decode(),
            }
        )

    async def stepwise(request: Request) -> Response:
        async def lines() -> AsyncIterator[bytes]:
            yield b"first\n"
            await probe.second.wait()
            yield b"second\n"

        return StreamingResponse(lines())

    async def endless(request: Request) -> Response:
        async def lines() -> AsyncIterator[bytes]:
            try:
                while True:
                    probe.sent += 1
                    yield b"x" * 1024
            finally:
                if not probe.ended.done():
                    probe.ended.set_result("generator closed")

        return StreamingResponse(lines())

    async def silent(request: Request) -> Response:
        try:
            await asyncio.sleep(3600)
        finally:
            probe.ended.set_result("cancelled")
        return Response()

    async def inventory(request: Request) -> Response:
        assert request.headers["authorization"] == "Bearer node-token"
        return Response(SandboxInventory(node_id="n1", sandboxes=[]).model_dump_json())

    return Starlette(
        routes=[
            Route("/echo/{name}", echo, methods=["POST"]),
            Route("/stepwise", stepwise),
            Route("/endless", endless),
            Route("/silent", silent),
            Route("/sandboxes", inventory),
        ]
    )


@pytest.fixture
async def probe() -> AsyncIterator[Probe]:
    probe = Probe()
    with local.published(ADDRESS, app_with(probe)):
        yield probe


def client(timeout: float = 5.0) -> httpx.AsyncClient:
    transport = local.transport_for(ADDRESS)
    assert transport is not None
    return httpx.AsyncClient(transport=transport, base_url="http://node", timeout=timeout)


async def _chunks() -> AsyncIterator[bytes]:
    for part in (b"one ", b"two ", b"three"):
        yield part


async def test_the_request_arrives_whole_streamed_body_included(probe: Probe) -> None:
    async with client() as http:
        response = await http.post(
            "/echo/a%20b",
            params={"q": "x y"},
            headers={"authorization": "Bearer t"},
            content=_chunks(),
        )
    assert response.status_code == 200
    assert response.json() == {
        "method": "POST",
        "path": "/echo/a b",
        "query": {"q": "x y"},
        "auth": "Bearer t",
        "body": "one two three",
    }


async def test_the_answer_streams_as_the_app_sends_it(probe: Probe) -> None:
    async with client() as http, http.stream("GET", "/stepwise") as response:
        lines = response.aiter_lines()
        assert await anext(lines) == "first"  # before the app sends the second
        probe.second.set()
        assert await anext(lines) == "second"


async def test_a_reader_that_stops_holds_the_app_back_and_closing_ends_it(probe: Probe) -> None:
    async with client() as http:
        async with http.stream("GET", "/endless") as response:
            await anext(response.aiter_raw())
            await asyncio.sleep(0.2)
            assert probe.sent <= local.QUEUE_CHUNKS + 3  # held back by the bounded queue
        assert await asyncio.wait_for(probe.ended, 2) == "generator closed"


async def test_no_answer_in_time_is_a_read_timeout_and_ends_the_app(probe: Probe) -> None:
    async with client(timeout=0.2) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.get("/silent")
    assert await asyncio.wait_for(probe.ended, 2) == "cancelled"


async def test_a_cancelled_request_ends_the_app(probe: Probe) -> None:
    async with client() as http:
        request = asyncio.create_task(http.get("/silent"))
        await asyncio.sleep(0.1)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
    assert await asyncio.wait_for(probe.ended, 2) == "cancelled"


async def test_an_app_that_fails_before_answering_is_a_protocol_error() -> None:
    async def broken(scope: object, receive: object, send: object) -> None:
        raise RuntimeError("boom")

    with local.published(ADDRESS, broken):
        async with client() as http:
            with pytest.raises(httpx.RemoteProtocolError, match="boom"):
                await http.get("/")


async def test_an_address_no_longer_served_fails_as_a_closed_socket() -> None:
    assert local.transport_for(ADDRESS) is None
    app = app_with(Probe())
    with local.published(ADDRESS, app):
        transport = local.transport_for(ADDRESS)
        with pytest.raises(RuntimeError, match="already served"), local.published(ADDRESS, app):
            pass
    assert transport is not None
    async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
        with pytest.raises(httpx.ConnectError):
            await http.get("/sandboxes")


async def test_the_gateways_node_client_uses_it_for_a_node_in_its_process(probe: Probe) -> None:
    node = NodeClient("n1", ADDRESS, "node-token")
    try:
        inventory = await node.inventory()  # there is no socket at ADDRESS
    finally:
        await node.close()
    assert inventory.node_id == "n1"
