"""A node fetching an image it lacks from a real gateway over HTTP, by digest."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from images import Image, ImageFetchError, ImageMeta, ImageNotFound, ImageStore
from images.digest import summarize
from images.fetch import ImageFetcher
from tests.conftest import free_port

TOKEN = "node-token-" + "x" * 24


def odd_tree(root: Path) -> Path:
    """A small rootfs with what a tar can get wrong: owners, setuid, a private root, an
    absolute symlink, a hard link, a fifo and (where allowed) a device node."""
    for d in ("bin", "etc", "home/user", "dev"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "bin/tool").write_bytes(b"\x7fELF tool")
    (root / "bin/tool").chmod(0o4755)
    os.link(root / "bin/tool", root / "bin/tool-again")
    (root / "bin/sh").symlink_to("/bin/tool")
    (root / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/:/bin/sh\n")
    os.chown(root / "home/user", 1000, 1000)
    os.mkfifo(root / "dev/fifo")
    with contextlib.suppress(PermissionError):  # not in every container
        os.mknod(root / "dev/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    root.chmod(0o750)
    return root


@dataclass
class Control:
    url: str
    store: ImageStore
    image: Image


@pytest.fixture
def control(live_server: Callable[..., str], tmp_path: Path, require_root: None) -> Control:
    """A gateway on a real socket whose image store holds ``base``."""
    store = ImageStore(tmp_path / "data" / "images")
    with store.staging() as rootfs:
        image = store.add(
            odd_tree(rootfs), ImageMeta(name="base", source="import", env={"A": "1"}, user="user")
        )
    url = live_server(node_token=SecretStr(TOKEN))
    return Control(url, store, image)


def fetcher(tmp_path: Path, urls: list[str], token: str = TOKEN) -> ImageFetcher:
    return ImageFetcher(ImageStore(tmp_path / "node-images"), urls, token)


def left_in(store: ImageStore) -> dict[str, Any]:
    return {
        "images": [i.digest for i in store.list()],
        "staging": sorted(p.name for p in (store.root / ".staging").iterdir()),
    }


def test_a_missing_digest_is_fetched_verified_and_kept(control: Control, tmp_path: Path) -> None:
    node = fetcher(tmp_path, [control.url])
    image = node.resolve(control.image.digest)
    assert image.digest == control.image.digest
    assert summarize(image.rootfs).digest == control.image.digest, "the very same tree"
    assert (image.env, image.user, image.name) == ({"A": "1"}, "user", "base")
    assert image.source == "fetched" and image.created == control.image.created
    assert node.store.names() == [], "the node's names are its own"
    assert left_in(node.store) == {"images": [control.image.digest], "staging": []}
    tool = image.rootfs / "bin/tool"
    assert tool.stat().st_ino == (image.rootfs / "bin/tool-again").stat().st_ino
    assert os.readlink(image.rootfs / "bin/sh") == "/bin/tool"
    assert node.resolve(control.image.digest).rootfs == image.rootfs, "kept"


def test_names_and_unknown_digests_are_not_found(control: Control, tmp_path: Path) -> None:
    node = fetcher(tmp_path, [control.url])
    with pytest.raises(ImageNotFound):
        node.resolve("base")  # a name is the node's own to know, never fetched
    with pytest.raises(ImageNotFound, match="404"):
        node.resolve("sha256:" + "0" * 64)
    assert left_in(node.store) == {"images": [], "staging": []}


def test_a_tampered_image_is_refused_and_leaves_nothing(control: Control, tmp_path: Path) -> None:
    (control.image.rootfs / "etc/passwd").write_text("root::0:0::/root:/bin/sh\n")
    node = fetcher(tmp_path, [control.url])
    with pytest.raises(ImageFetchError, match="digest is sha256:"):
        node.resolve(control.image.digest)
    assert left_in(node.store) == {"images": [], "staging": []}


def test_a_wrong_token_or_no_control_plane_fails_clearly(control: Control, tmp_path: Path) -> None:
    with pytest.raises(ImageFetchError, match="403"):
        fetcher(tmp_path, [control.url], token="wrong").resolve(control.image.digest)
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ImageFetchError, match="cannot be reached"):
        fetcher(tmp_path, [closed]).resolve(control.image.digest)
    # the next URL is tried after one that fails
    node = fetcher(tmp_path, [closed, control.url])
    assert node.resolve(control.image.digest).digest == control.image.digest


def test_concurrent_resolves_of_a_missing_digest_fetch_it_once(
    control: Control, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = fetcher(tmp_path, [control.url])
    entered = threading.Semaphore(0)
    fetches: list[str] = []
    fetch = node.fetch
    resolve = node.resolve

    def counting_resolve(ref: str) -> Image:
        entered.release()
        return resolve(ref)

    def slow_fetch(digest: str) -> Image:
        fetches.append(digest)
        # hold the lock until the other resolve has asked too (or waited long enough)
        entered.acquire(timeout=10)
        entered.acquire(timeout=10)
        return fetch(digest)

    monkeypatch.setattr(node, "fetch", slow_fetch)
    results: list[Image] = []
    threads = [
        threading.Thread(target=lambda: results.append(counting_resolve(control.image.digest)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert fetches == [control.image.digest]
    assert [r.digest for r in results] == [control.image.digest] * 2
    assert left_in(node.store) == {"images": [control.image.digest], "staging": []}
