"""The node's image lookup for sandboxes: its store, then the control plane's."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtimes.node.settings import NodeSettings
from runtimes.sandboxes.base import ImageFetchFailed, ImageUnavailable
from runtimes.sandboxes.service import image_store_resolver
from tests.conftest import free_port


def test_control_urls_are_comma_separated() -> None:
    settings = NodeSettings(control_url=" http://a:8080/, http://b:8080 ,")
    assert settings.control_urls == ["http://a:8080/", "http://b:8080"]
    assert NodeSettings().control_urls == []


def test_a_missing_image_is_not_found_and_a_failed_fetch_unavailable(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    resolve = image_store_resolver(tmp_path / "images", control_urls=[closed], token="t")
    with pytest.raises(ImageUnavailable):
        resolve("python")  # a name is never fetched
    with pytest.raises(ImageFetchFailed, match="cannot be reached"):
        resolve("sha256:" + "a" * 64)
    without = image_store_resolver(tmp_path / "images")
    with pytest.raises(ImageUnavailable):
        without("sha256:" + "a" * 64)  # no control plane: nothing to fetch from
