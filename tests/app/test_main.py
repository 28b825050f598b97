"""The app factory."""

from __future__ import annotations

from collections.abc import Callable

from app.main import create_app
from app.settings import Settings


def test_apps_of_one_process_share_one_openapi_document(
    make_settings: Callable[..., Settings],
) -> None:
    """Building the document walks every schema model: once per process, not per app
    (the suite builds hundreds of apps), and the same for any settings."""
    first = create_app(make_settings())
    second = create_app(make_settings(max_body_bytes=1024, dev_mode=False))
    assert first.state.openapi is second.state.openapi
    assert first.state.openapi["info"] == {"title": "Corral", "version": "0.1.0"}
