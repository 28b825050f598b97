"""``GET /v1/images``: a tenant sees the images sandboxes are made from (the control
plane's store), by name and digest, with E2B's template names, and nothing of the host."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from app.cli import main
from app.main import create_app
from app.settings import Settings
from images import ImageMeta, ImageStore
from tests.conftest import ADMIN


@pytest.fixture
def images_dir(tmp_path: Path) -> Path:
    store = ImageStore(tmp_path / "images")
    for name in ("python", "data", "tiny"):
        tree = tmp_path / f"tree-{name}"
        (tree / "etc").mkdir(parents=True)
        (tree / "etc/name").write_text(name)
        meta = ImageMeta(name=name, source="debootstrap", packages=("python3",), user="user")
        store.add(tree, meta)
    return tmp_path / "images"


@pytest.fixture
def client(make_settings: Callable[..., Settings], images_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(images_dir=images_dir))) as test_client:
        yield test_client


def tenant_headers(client: TestClient) -> dict[str, str]:
    made = client.post("/v1/tenants", json={"name": "img"}, headers=ADMIN).json()
    return {"Authorization": f"Bearer {made['key']['api_key']}"}


def test_a_tenant_lists_the_images_and_reads_one(client: TestClient, images_dir: Path) -> None:
    headers = tenant_headers(client)
    listed = client.get("/v1/images", headers=headers)
    assert listed.status_code == 200, listed.text
    images: list[dict[str, Any]] = listed.json()["images"]
    by_name = {i["name"]: i for i in images}
    assert set(by_name) == {"python", "data", "tiny"}
    assert by_name["data"]["templates"] == ["code-interpreter", "code-interpreter-v1"]
    assert by_name["python"]["templates"] == ["base"] and by_name["tiny"]["templates"] == []
    assert by_name["tiny"]["user"] == "user" and by_name["tiny"]["packages"] == ["python3"]
    assert str(images_dir) not in listed.text  # no host path
    one = client.get(f"/v1/images/{by_name['tiny']['digest']}", headers=headers)
    assert one.status_code == 200 and one.json()["name"] == "tiny"
    missing = client.get("/v1/images/nope", headers=headers)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "image_not_found"
    assert client.get("/v1/images").status_code == 401


def test_corral_images_ls_asks_the_server(
    live_server: Callable[..., str], images_dir: Path
) -> None:
    url = live_server(images_dir=images_dir)
    made = httpx.post(f"{url}/v1/tenants", json={"name": "cli"}, headers=ADMIN).json()
    env = {"CORRAL_URL": url, "CORRAL_API_KEY": made["key"]["api_key"]}
    listed = CliRunner().invoke(main, ["images", "ls"], env=env)
    assert listed.exit_code == 0, listed.output
    rows = [line.split()[0] for line in listed.stdout.splitlines()[1:]]
    assert sorted(rows) == ["data", "python", "tiny"]
    keyless = CliRunner().invoke(main, ["images", "ls"], env={"CORRAL_URL": url})
    assert keyless.exit_code == 1 and "401 missing_api_key" in keyless.stderr
