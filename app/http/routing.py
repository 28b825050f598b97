"""A router that finds a request's route by its path in a table before scanning.

Starlette's ``Router`` tries each route's pattern in turn until one matches: a request for
a route far down the list (an E2B envd call, the 60th route or so) pays a regular
expression match for every route before it. ``TableRouter`` keeps, for each static path
(no path parameters) and method, the route a scan would choose, and goes straight to it;
anything else (a path with parameters, a method the path's route refuses, a mounted app)
is scanned as Starlette does.

The table holds a route only if the scan would choose it: no route before it in the list
matches its path and method, which is checked once, when the table is built, by asking
those routes as the scan does. Paths are looked up as the route sees them (under an
empty ``root_path``); with any other ``root_path`` the router scans.
"""

from __future__ import annotations

from starlette.routing import BaseRoute, Match, Route, Router
from starlette.types import Receive, Scope, Send

#: What ``Route`` adds to the methods it is given ("GET" routes answer "HEAD" too).
_ANY = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


class TableRouter(Router):
    def __init__(self, routes: list[BaseRoute], **kwargs: object) -> None:
        super().__init__(routes, **kwargs)  # type: ignore[arg-type]
        self.table = static_table(self.routes)

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            route = self.table.get((scope["path"], scope["method"]))
            if route is not None:
                scope.setdefault("router", self)
                scope["route"] = route
                scope["endpoint"] = route.endpoint
                scope["path_params"] = dict(scope.get("path_params", {}))
                await route.handle(scope, receive, send)
                return
        await super().app(scope, receive, send)


def static_table(routes: list[BaseRoute]) -> dict[tuple[str, str], Route]:
    """(path, method) -> the route a scan of ``routes`` chooses for it, for the routes
    whose path has no parameters."""
    table: dict[tuple[str, str], Route] = {}
    for index, route in enumerate(routes):
        if not isinstance(route, Route) or route.param_convertors:
            continue
        for method in sorted(route.methods or _ANY):
            key = (route.path, method)
            if key in table:
                continue
            scope = {"type": "http", "path": route.path, "root_path": "", "method": method}
            if route.matches(scope)[0] is not Match.FULL:
                continue
            if any(earlier.matches(scope)[0] is Match.FULL for earlier in routes[:index]):
                continue  # an earlier route takes it: the scan finds that one
            table[key] = route
    return table
