"""A placement on a node counts against its free slots until its dispatch is over, and
no longer: also when the call fails between placement and dispatch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.conftest import ADMIN


def test_every_placement_lands_also_when_the_call_fails_before_its_dispatch(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(dev_mode=True, failpoints={"invocations.after_commit": "raise-once"})
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        catalogue: Any = client.app.state.services.invocations._placement.catalogue  # type: ignore[attr-defined]
        created = client.post("/v1/tenants", json={"name": "t"}, headers=ADMIN)
        headers = {"Authorization": f"Bearer {created.json()['key']['api_key']}"}
        body = {"language": "fake", "code": '{"stdout": "ok"}'}
        failed = client.post("/v1/run", json=body, headers=headers)
        assert failed.status_code >= 500  # the injected fault, between commit and dispatch
        assert catalogue.on_the_way() == 0
        done = client.post("/v1/run", json=body, headers=headers)
        assert done.status_code == 200, done.text
        assert catalogue.on_the_way() == 0
