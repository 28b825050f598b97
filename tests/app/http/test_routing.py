"""The route table chooses, for every static path and method, the route Starlette's scan
of the list chooses, and leaves every other request to the scan."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Match, Route
from starlette.testclient import TestClient

from app.http.routing import TableRouter, static_table
from app.main import create_app
from app.settings import Settings
from tests.conftest import ADMIN_KEY


def answer(name: str) -> Any:
    async def endpoint(request: Request) -> Response:
        return PlainTextResponse(f"{name} {dict(request.path_params)}")

    return endpoint


def scanned(routes: list[BaseRoute], path: str, method: str) -> BaseRoute | None:
    """The route Starlette's scan hands the request to (a full match, else a partial)."""
    scope = {"type": "http", "path": path, "root_path": "", "method": method}
    partial = None
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return route
        if match is Match.PARTIAL and partial is None:
            partial = route
    return partial


def test_the_table_holds_what_the_scan_would_choose_for_every_route_of_the_app() -> None:
    app = create_app(Settings(admin_key=ADMIN_KEY, dev_mode=True))
    router = app.router
    assert isinstance(router, TableRouter)
    assert ("/v1/run", "POST") in router.table
    for (path, method), route in router.table.items():
        assert scanned(router.routes, path, method) is route, (path, method)


def test_an_earlier_route_with_parameters_keeps_the_paths_it_takes() -> None:
    routes: list[BaseRoute] = [
        Route("/items/{name}", answer("by-name"), methods=["GET"]),
        Route("/items/special", answer("special"), methods=["GET", "POST"]),
        Route("/other", answer("other"), methods=["POST"]),
    ]
    table = static_table(routes)
    # GET /items/special is the parametrised route's (it comes first); POST is not
    assert ("/items/special", "GET") not in table
    assert table[("/items/special", "POST")] is routes[1]
    with TestClient(TableRouter(routes)) as client:
        assert client.get("/items/special").text == "by-name {'name': 'special'}"
        assert client.post("/items/special").text == "special {}"
        assert client.get("/items/x").text == "by-name {'name': 'x'}"
        assert client.get("/other").status_code == 405  # the scan's partial match
        assert client.get("/missing").status_code == 404
