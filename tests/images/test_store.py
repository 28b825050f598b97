"""The image store: add is atomic, names resolve, leftovers of a crash are swept."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from images import ImageBuildError, ImageError, ImageMeta, ImageNotFound, ImageStore
from images import store as store_module
from images.fsutil import remove_tree


def tree(root: Path, content: str = "hello\n") -> Path:
    (root / "etc").mkdir(parents=True)
    (root / "etc/greeting").write_text(content)
    return root


def meta(name: str, **kw: object) -> ImageMeta:
    return ImageMeta(name=name, source="import", **kw)  # type: ignore[arg-type]


def staging_entries(store: ImageStore) -> list[str]:
    return sorted(p.name for p in (store.root / ".staging").iterdir())


def test_add_then_resolve_by_name_digest_and_prefix(store: ImageStore, tmp_path: Path) -> None:
    image = store.add(
        tree(tmp_path / "t"),
        meta("base", env={"A": "1"}, user="user", workdir="/home/user", packages=("bash",)),
    )
    assert image.name == "base"
    assert (image.rootfs / "etc/greeting").read_text() == "hello\n"
    assert image.rootfs == store.root / image.digest.removeprefix("sha256:") / "rootfs"
    assert (image.env, image.user, image.workdir) == ({"A": "1"}, "user", "/home/user")
    assert image.size_bytes == 6 and image.source == "import" and image.packages == ("bash",)
    assert abs(image.created - time.time()) < 60
    assert store.resolve("base") == image
    assert store.resolve(image.digest).digest == image.digest
    assert store.resolve("sha256:" + image.short_digest).digest == image.digest
    record = json.loads((image.rootfs.parent / "image.json").read_text())
    assert record["digest"] == image.digest and record["source"] == "import"
    assert staging_entries(store) == []
    assert (tmp_path / "t/etc/greeting").exists(), "a tree from outside the store is copied"


@pytest.mark.parametrize("ref", ["nope", "sha256:" + "0" * 64, "sha256:00", "../etc", "a/b", ""])
def test_resolve_unknown_raises_image_not_found(store: ImageStore, ref: str) -> None:
    with pytest.raises(ImageNotFound):
        store.resolve(ref)


def test_invalid_names_are_refused(store: ImageStore, tmp_path: Path) -> None:
    for name in ("../x", "a/b", "", "sha256:abc", ".hidden", "x" * 129):
        with pytest.raises(ImageError, match="invalid image name"):
            store.add(tree(tmp_path / f"t{len(name)}"), meta(name))


def test_same_tree_is_reused_under_a_second_name(store: ImageStore, tmp_path: Path) -> None:
    first = store.add(tree(tmp_path / "a"), meta("one"))
    second = store.add(tree(tmp_path / "b"), meta("two"))
    assert first.digest == second.digest
    assert second.created == first.created
    assert [(i.name, i.digest) for i in store.list()] == [
        ("one", first.digest),
        ("two", first.digest),
    ]
    assert staging_entries(store) == []


def test_staging_is_moved_not_copied(store: ImageStore) -> None:
    with store.staging() as rootfs:
        tree(rootfs)
        image = store.add(rootfs, meta("moved"))
        assert not rootfs.exists()
    assert (image.rootfs / "etc/greeting").exists()
    assert staging_entries(store) == []


def test_a_failed_add_leaves_nothing_visible(
    store: ImageStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_module.os, "rename", crash)
    with pytest.raises(ImageBuildError, match="No space left"):
        store.add(tree(tmp_path / "t"), meta("broken"))
    monkeypatch.undo()
    assert store.list() == []
    assert store.names() == []
    assert staging_entries(store) == []
    with pytest.raises(ImageNotFound):
        store.resolve("broken")


def test_crash_leftovers_are_swept_when_old(tmp_path: Path) -> None:
    root = tmp_path / "images"
    store = ImageStore(root)
    old, fresh = root / ".staging/old", root / ".staging/fresh"
    for box in (old, fresh):
        tree(box / "rootfs")
    (root / "names/.tmp-python-1234").write_text("{")
    two_hours_ago = time.time() - 7200
    for path in (old, root / "names/.tmp-python-1234"):
        os.utime(path, (two_hours_ago, two_hours_ago))
    ImageStore(root)
    assert staging_entries(store) == ["fresh"], "a build in progress elsewhere is kept"
    assert store.names() == []
    assert [p.name for p in (root / "names").iterdir()] == []


def test_half_made_or_dangling_entries_are_not_images(store: ImageStore) -> None:
    hex_ = "ab" * 32
    (store.root / hex_ / "rootfs").mkdir(parents=True)  # no image.json: never complete
    (store.root / "names/ghost").write_text(json.dumps({"digest": "sha256:" + "cd" * 32}))
    assert store.list() == []
    with pytest.raises(ImageNotFound):
        store.resolve("sha256:" + hex_)
    with pytest.raises(ImageNotFound):
        store.resolve("ghost")


def test_remove_by_name_keeps_an_image_another_name_holds(
    store: ImageStore, tmp_path: Path
) -> None:
    image = store.add(tree(tmp_path / "a"), meta("one"))
    store.tag("two", "one")
    store.remove("one")
    assert store.resolve("two").digest == image.digest
    store.remove("two")
    assert store.list() == []
    assert not image.rootfs.parent.exists()
    assert staging_entries(store) == []
    with pytest.raises(ImageNotFound):
        store.remove("two")


def test_remove_by_digest_removes_every_name(store: ImageStore, tmp_path: Path) -> None:
    image = store.add(tree(tmp_path / "a"), meta("one"))
    store.tag("two", image.digest)
    store.remove(image.digest)
    assert store.list() == [] and store.names() == []


def test_renaming_a_name_to_a_new_build_leaves_the_old_image_unnamed(
    store: ImageStore, tmp_path: Path
) -> None:
    old = store.add(tree(tmp_path / "a", "v1\n"), meta("app"))
    new = store.add(tree(tmp_path / "b", "v2\n"), meta("app"))
    listed = {(i.name, i.digest) for i in store.list()}
    assert listed == {("app", new.digest), ("", old.digest)}
    store.remove(old.digest)
    assert [i.digest for i in store.list()] == [new.digest]


def test_remove_tree_refuses_to_delete_through_a_mount(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    target = tmp_path / "box/rootfs/proc"
    target.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(target)], check=True)
    try:
        (target / "precious").write_text("x")
        with pytest.raises(ImageError, match="mounts under it"):
            remove_tree(tmp_path / "box")
        assert (target / "precious").exists()
    finally:
        subprocess.run(["umount", str(target)], check=True)
    remove_tree(tmp_path / "box")
    assert not (tmp_path / "box").exists()


def test_add_verified_keeps_a_tree_of_the_digest_without_a_name(
    store: ImageStore, tmp_path: Path
) -> None:
    digest = ImageStore(tmp_path / "other").add(tree(tmp_path / "src"), meta("base")).digest
    with store.staging() as rootfs:
        tree(rootfs)
        image = store.add_verified(
            rootfs, meta("base", env={"A": "1"}), digest=digest, created=123.0
        )
    assert image.digest == digest and image.created == 123.0 and image.env == {"A": "1"}
    assert store.names() == [], "a verified add writes no name"
    assert store.resolve(digest).name == "base", "the name it was first added under"
    assert staging_entries(store) == []


def test_add_verified_refuses_another_tree_and_keeps_nothing(
    store: ImageStore, tmp_path: Path
) -> None:
    digest = ImageStore(tmp_path / "other").add(tree(tmp_path / "src"), meta("base")).digest
    with pytest.raises(ImageBuildError, match="not the sha256:"), store.staging() as rootfs:
        tree(rootfs, "tampered\n")
        store.add_verified(rootfs, meta("base"), digest=digest, created=1.0)
    assert store.list() == [] and staging_entries(store) == []
    with pytest.raises(ImageBuildError, match="not a staging directory"):
        store.add_verified(tree(tmp_path / "outside"), meta("x"), digest=digest, created=1.0)
