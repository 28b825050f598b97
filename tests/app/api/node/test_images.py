"""``/internal/images``: the control plane's images, to nodes holding the node token."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import SecretStr
from starlette.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from images import ImageMeta, ImageStore
from wire.images import DIGEST_HEADER, IMAGE_PATH, ROOTFS_PATH, ImageManifest

TOKEN = "node-token-" + "y" * 24


def add_image(images_dir: Path) -> str:
    store = ImageStore(images_dir)
    with store.staging() as rootfs:
        (rootfs / "etc").mkdir()
        (rootfs / "etc/hello").write_text("hi\n")
        return store.add(rootfs, ImageMeta(name="tiny", source="import", workdir="/etc")).digest


def test_a_node_gets_the_manifest_and_the_tree_by_digest(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    digest = add_image(tmp_path / "data" / "images")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(create_app(make_settings(node_token=SecretStr(TOKEN)))) as client:
        got = client.get(IMAGE_PATH.format(digest=digest), headers=auth)
        assert got.status_code == 200, got.text
        manifest = ImageManifest.model_validate_json(got.content)
        assert (manifest.digest, manifest.name, manifest.workdir) == (digest, "tiny", "/etc")
        tar = client.get(ROOTFS_PATH.format(digest=digest), headers=auth)
        assert tar.status_code == 200 and tar.headers[DIGEST_HEADER] == digest
        with tarfile.open(fileobj=io.BytesIO(tar.content)) as archive:
            assert sorted(archive.getnames()) == [".", "./etc", "./etc/hello"]
            member = archive.extractfile("./etc/hello")
            assert member is not None and member.read() == b"hi\n"
        for ref in ("sha256:" + "0" * 64, digest[:20], "tiny"):
            missing = client.get(ROOTFS_PATH.format(digest=ref), headers=auth)
            assert missing.status_code == 404, ref
            assert missing.json()["error"]["code"] == "image_not_found"


@pytest.mark.parametrize(
    ("token", "headers", "status", "code"),
    [
        (TOKEN, {}, 401, "missing_node_token"),
        (TOKEN, {"Authorization": "Basic abc"}, 401, "missing_node_token"),
        (TOKEN, {"Authorization": "Bearer wrong"}, 403, "invalid_node_token"),
        (None, {"Authorization": "Bearer anything"}, 403, "invalid_node_token"),
    ],
)
def test_anything_but_the_node_token_is_refused(
    make_settings: Callable[..., Settings],
    tmp_path: Path,
    token: str | None,
    headers: dict[str, str],
    status: int,
    code: str,
) -> None:
    digest = add_image(tmp_path / "data" / "images")
    settings = make_settings(node_token=SecretStr(token) if token else None)
    with TestClient(create_app(settings)) as client:
        for path in (IMAGE_PATH, ROOTFS_PATH):
            response = client.get(path.format(digest=digest), headers=headers)
            assert response.status_code == status
            assert response.json()["error"]["code"] == code
