"""``corral images``: build, import, ls and rm against a store in a temporary dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from app.cli import main
from images import ImageMeta, ImageStore
from node.settings import NodeSettings


def images(images_dir: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["images", *args], env={"CORRAL_IMAGES_DIR": str(images_dir)})


def add_image(images_dir: Path, tmp_path: Path, name: str) -> str:
    tree = tmp_path / f"tree-{name}"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc/name").write_text(name)
    return ImageStore(images_dir).add(tree, ImageMeta(name=name, source="import")).digest


def test_images_dir_setting() -> None:
    assert NodeSettings().resolved_images_dir == Path("var/images")
    assert NodeSettings(data_dir=Path("/srv/c")).resolved_images_dir == Path("/srv/c/images")
    assert NodeSettings(images_dir=Path("/cache")).resolved_images_dir == Path("/cache")


def test_ls_and_rm(tmp_path: Path) -> None:
    images_dir = tmp_path / "images"
    empty = images(images_dir, "ls", "--local")
    assert empty.exit_code == 0, empty.output
    assert empty.stdout.split() == ["NAME", "DIGEST", "SIZE", "CREATED"]
    digest = add_image(images_dir, tmp_path, "alpha")
    listed = images(images_dir, "ls", "--local")
    row = listed.stdout.splitlines()[1].split()
    assert row[:4] == ["alpha", digest[7:19], "0.0", "MB"]
    removed = images(images_dir, "rm", "alpha")
    assert removed.exit_code == 0 and removed.stdout == "removed alpha\n"
    assert images(images_dir, "ls", "--local").stdout.count("\n") == 1


def test_rm_unknown_is_a_clean_error(tmp_path: Path) -> None:
    result = images(tmp_path / "images", "rm", "nope")
    assert result.exit_code == 1
    assert result.stderr == "Error: no image named 'nope'\n"


def test_build_without_a_recipe_or_dockerfile_says_what_exists(tmp_path: Path) -> None:
    result = images(tmp_path / "images", "build", "ruby")
    assert result.exit_code == 2
    assert "no built-in recipe 'ruby' (there are: data, python)" in result.stderr
    assert "-f Dockerfile" in result.stderr


def test_the_images_dir_follows_the_data_dir(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["images", "ls", "--local"], env={"CORRAL_DATA_DIR": str(tmp_path)}
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "images/names").is_dir()


def test_import_a_rootfs_tar(tmp_path: Path) -> None:
    import tarfile

    if os.geteuid() != 0:
        pytest.skip("unpacking with owners needs root")
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc/os-release").write_text("ID=test\n")
    archive = tmp_path / "rootfs.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname=".")
    images_dir = tmp_path / "images"
    result = images(images_dir, "import", str(archive), "--name", "tiny")
    assert result.exit_code == 0, result.output
    name, digest = result.stdout.split()
    assert name == "tiny" and digest.startswith("sha256:")
    assert "importing" in result.stderr and "(rootfs)" in result.stderr
    assert images(images_dir, "ls", "--local").stdout.splitlines()[1].split()[:2] == [
        "tiny",
        digest[7:19],
    ]
    bad = images(images_dir, "import", str(archive), "--name", "../x")
    assert bad.exit_code == 1 and "invalid image name" in bad.stderr
