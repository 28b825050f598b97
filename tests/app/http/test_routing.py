"""The route table chooses, for every static path and method, the route Starlette's scan
of the list chooses; a path with parameters gets the scan's first full match from the
routes its literal prefix allows; everything else is left to the scan."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Match, Route
from starlette.testclient import TestClient

from app.http.routing import TableRouter, literal_prefix, path_head, static_table
from app.main import create_app
from app.settings import Settings
from tests.conftest import ADMIN_KEY


def answer(name: str) -> Any:
    async def endpoint(request: Request) -> Response:
        return PlainTextResponse(f"{name} {dict(request.path_params)}")

    return endpoint


def first_full(routes: list[BaseRoute], path: str, method: str) -> BaseRoute | None:
    """The first route of a whole scan that matches fully."""
    scope = {"type": "http", "path": path, "root_path": "", "method": method}
    return next((r for r in routes if r.matches(scope)[0] is Match.FULL), None)


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


def _filled(path: str) -> list[str]:
    """Request paths for a route's path: each parameter filled in a few ways."""
    fills = ["x", "special", "a1b2"]
    out = []
    for fill in fills:
        text = path
        while "{" in text:
            start = text.index("{")
            end = text.index("}", start)
            kind = text[start + 1 : end].partition(":")[2]
            value = {"path": f"{fill}/deeper", "int": "7"}.get(kind, fill)
            text = text[:start] + value + text[end + 1 :]
        out.append(text)
    return out


def test_a_path_with_parameters_gets_the_scans_first_full_match_for_every_app_route() -> None:
    app = create_app(Settings(admin_key=ADMIN_KEY, dev_mode=True))
    router = app.router
    assert isinstance(router, TableRouter)
    paths = {p for route in router.routes for p in _filled(getattr(route, "path", "/"))}
    paths |= {"/v1/functions/fib-c/invoke", "/v1/functions/fib-c/invoke/", "/nowhere/at/all"}
    checked = 0
    for path in sorted(paths):
        for method in ("GET", "POST", "PUT", "DELETE", "PATCH"):
            scope = {"type": "http", "path": path, "root_path": "", "method": method}
            found = router.first_full_match(scope)
            assert (found[0] if found else None) is first_full(router.routes, path, method)
            checked += found is not None
    assert checked > 50  # most filled paths are some route's


def test_a_paths_head_is_its_first_two_segments() -> None:
    assert path_head("/v1/functions/fib-c/invoke") == "/v1/functions/"
    assert path_head("/v1/functions/") == "/v1/functions/"
    assert [path_head(p) for p in ("/v1/run", "/v1/", "/", "")] == ["", "", "", ""]


def test_a_routes_literal_prefix_ends_at_its_first_parameter() -> None:
    assert literal_prefix(Route("/v1/functions/{name}/invoke", answer("a"))) == "/v1/functions/"
    assert literal_prefix(Route("/v1/run", answer("a"))) == "/v1/run"


def test_parametrised_routes_answer_as_the_scan_would() -> None:
    routes: list[BaseRoute] = [
        Route("/items/{name}/x", answer("x-post"), methods=["POST"]),
        Route("/items/{name}", answer("by-name"), methods=["GET"]),
        Route("/items/{name}/x", answer("x-get"), methods=["GET"]),
        Route("/things/{id:int}", answer("thing"), methods=["GET"]),
    ]
    with TestClient(TableRouter(routes)) as client:
        assert client.get("/items/a/x").text == "x-get {'name': 'a'}"  # after a partial
        assert client.post("/items/a/x").text == "x-post {'name': 'a'}"
        assert client.get("/items/b").text == "by-name {'name': 'b'}"
        assert client.get("/things/3").text == "thing {'id': 3}"
        assert client.delete("/items/a/x").status_code == 405  # only partial matches
        assert client.get("/things/nope").status_code == 404
