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


@pytest.mark.parametrize(
    ("dockerfile", "message"),
    [
        ("FROM python\nADD x.tar /\n", "Dockerfile line 2: ADD: ADD is not supported"),
        ("FROM python\nRUN --mount=type=cache,target=/x true\n", "--mount is not supported"),
        ('FROM python\nSHELL ["/bin/bash"]\n', "line 2: SHELL: this instruction is not"),
        ("FROM python\nFROM python\n", "multi-stage builds are not supported"),
        ("RUN true\n", "the first instruction must be FROM"),
        ("FROM python\nCOPY ../secret /\n", "outside the build context"),
        ("FROM scratch\n", "line 1: FROM: a tenant's build starts FROM an image"),
        ("FROM elsewhere:3.12\n", "line 1: FROM: no image 'elsewhere:3.12'"),
    ],
)
def test_a_dockerfile_outside_the_subset_is_refused_before_any_sandbox(
    client: TestClient, dockerfile: str, message: str
) -> None:
    headers = tenant_headers(client)
    answer = client.post(
        "/v1/images",
        data={"name": "mine"},
        files={"dockerfile": ("Dockerfile", dockerfile)},
        headers=headers,
    )
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_dockerfile" and message in error["message"], error
    for state in ("live", "stopping", "stopped"):
        made = client.get("/v1/sandboxes", params={"state": state}, headers=headers)
        assert made.json()["sandboxes"] == [], state
    assert client.get("/v1/images/mine", headers=headers).status_code == 404


def test_a_build_request_is_checked_before_it_starts(client: TestClient) -> None:
    headers = tenant_headers(client)

    def post(fields: dict[str, str]) -> Any:
        files = {"dockerfile": ("Dockerfile", "FROM python\n")}
        return client.post("/v1/images", data=fields, files=files, headers=headers)

    taken = post({"name": "tiny"})  # a catalogue image's name
    assert taken.status_code == 409 and "catalogue image" in taken.json()["error"]["message"]
    assert post({"name": "base"}).status_code == 409  # an E2B template's
    assert post({"name": "sha256:abc"}).json()["error"]["code"] == "validation_error"
    assert post({"name": "x", "memory_mb": "1"}).json()["error"]["code"] == "validation_error"
    bad_network = post({"name": "x", "network": "{not json"})
    assert bad_network.json()["error"]["code"] == "validation_error"
    no_file = post({"name": "x", "context": "text"})
    assert no_file.status_code == 422 and "'context' is a file" in no_file.text
    missing = client.post(
        "/v1/images", data={"name": "x"}, files={"context": ("c.tar", b"")}, headers=headers
    )
    assert missing.status_code == 422 and "needs a 'dockerfile'" in missing.text
    as_json = client.post("/v1/images", json={"name": "x"}, headers=headers)
    assert as_json.status_code == 415
    assert client.delete("/v1/images/tiny", headers=headers).status_code == 404
    assert client.delete("/v1/images/tiny", headers=ADMIN).status_code in (401, 403)


def test_a_name_is_kept_once_among_a_tenants_live_images(client: TestClient) -> None:
    """Two builds racing for one name: the second's row is refused (409), and a deleted
    image's name is free again."""
    from datetime import UTC, datetime

    from app.db.models import TenantImage
    from app.errors import Conflict

    made = client.post("/v1/tenants", json={"name": "racer"}, headers=ADMIN).json()
    tenant_id = made["tenant"]["id"]
    owned = client.app.state.services.sandboxes.owned  # type: ignore[attr-defined]

    def image(image_id: str) -> TenantImage:
        return TenantImage(
            id=image_id,
            tenant_id=tenant_id,
            name="same",
            snapshot_id=f"snap_{image_id}",
            parent="python",
            env={},
            user="user",
            workdir="/",
            command={},
            size_bytes=1,
            created_at=datetime.now(UTC),
        )

    run = client.portal.call  # type: ignore[union-attr]
    run(owned.add, image("img_1"))
    with pytest.raises(Conflict):
        run(owned.add, image("img_2"))
    run(owned.forget, "img_1")
    run(owned.add, image("img_3"))
    found = run(owned.find, tenant_id, "same")
    assert found is not None and found.id == "img_3"
