"""The node's image lookup for sandboxes: its store, then the control plane's."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.sandboxes.base import ImageFetchFailed, ImageUnavailable
from node.sandboxes.service import image_store_resolver
from node.settings import NodeSettings
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


def test_the_container_backend_is_built_with_the_nodes_walls(tmp_path: Path) -> None:
    """The settings reach the crun backend: ranges, LXCFS, and one memory bound over all
    sandboxes that never exceeds the host less its reserve, whatever placement promises."""
    from node.sandboxes.base import create_backend
    from node.sandboxes.crun.backend import CrunBackend
    from node.settings import default_sandbox_memory_mb

    physical = default_sandbox_memory_mb(1024)
    settings = NodeSettings(
        data_dir=tmp_path,
        sandbox_uid_ranges_dir=tmp_path / "ranges",
        sandbox_uid_first=1 << 30,
        sandbox_uid_slots=64,
        sandbox_lxcfs_dir=None,
        memory_reserve_mb=1024,
        sandbox_memory_mb=physical * 4,  # overcommitted placement
    )
    backend = create_backend("crun", settings)
    assert isinstance(backend, CrunBackend)
    assert backend.memory_limit_mb == physical
    assert backend.ranges is not None and backend.ranges.registry == tmp_path / "ranges"
    assert backend.ranges.first == 1 << 30 and backend.ranges.slots == 64
    assert not backend.lxcfs.enabled
    modest = create_backend("crun", settings.model_copy(update={"sandbox_memory_mb": 2048}))
    assert isinstance(modest, CrunBackend) and modest.memory_limit_mb == 2048
    bare = create_backend("crun", settings.model_copy(update={"sandbox_user_namespaces": False}))
    assert isinstance(bare, CrunBackend) and bare.ranges is None
