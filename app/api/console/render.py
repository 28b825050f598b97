"""Rendering a console page: the templates, what every page is given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from app.api.console.sessions import User
from app.services import Services

HERE = Path(__file__).parent
TEMPLATES = Jinja2Templates(directory=HERE / "templates")
#: the chart library, installed from npm by scripts/setup-console.sh
CHART_JS = HERE / "static" / "vendor" / "chart.js" / "dist" / "chart.umd.js"
#: the terminal's (xterm.js and its fit addon), installed the same way
XTERM_JS = HERE / "static" / "vendor" / "xterm" / "lib" / "xterm.js"


def services_of(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def render(
    request: Request, user: User | None, template: str, context: dict[str, Any], status: int = 200
) -> Response:
    return TEMPLATES.TemplateResponse(
        request,
        template,
        {"user": user, "chart_js": CHART_JS.exists(), "xterm": XTERM_JS.exists(), **context},
        status_code=status,
    )
