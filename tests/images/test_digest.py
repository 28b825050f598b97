"""The digest of a tree: deterministic, and sensitive to what makes a tree different."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from images.digest import summarize


def make_tree(root: Path) -> Path:
    (root / "etc").mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "etc/hostname").write_text("sandbox\n")
    (root / "bin/tool").write_bytes(b"#!/bin/sh\necho hi\n")
    (root / "bin/tool").chmod(0o755)
    (root / "bin/alias").symlink_to("tool")
    (root / "empty").mkdir()
    os.mkfifo(root / "fifo")
    return root


def test_same_tree_same_digest(tmp_path: Path) -> None:
    a, b = make_tree(tmp_path / "a"), make_tree(tmp_path / "b")
    os.utime(b / "etc/hostname", (1, 1))  # timestamps are not part of it
    first, second = summarize(a), summarize(b)
    assert first.digest == second.digest
    assert first.digest.startswith("sha256:") and len(first.digest) == 7 + 64
    assert first.size_bytes == len("sandbox\n") + len(b"#!/bin/sh\necho hi\n")
    assert first.entries == 8  # . etc bin empty fifo hostname tool alias


def _byte(root: Path) -> None:
    (root / "etc/hostname").write_text("sandbox!\n")


def _mode(root: Path) -> None:
    (root / "bin/tool").chmod(0o750)


def _dir_mode(root: Path) -> None:
    (root / "empty").chmod(0o700)


def _symlink_target(root: Path) -> None:
    (root / "bin/alias").unlink()
    (root / "bin/alias").symlink_to("./tool")


def _owner(root: Path) -> None:
    os.lchown(root / "etc/hostname", 1000, 1000)


def _rename(root: Path) -> None:
    (root / "etc/hostname").rename(root / "etc/hostname2")


def _new_empty_dir(root: Path) -> None:
    (root / "empty/sub").mkdir()


def _file_to_symlink(root: Path) -> None:
    (root / "etc/hostname").unlink()
    (root / "etc/hostname").symlink_to("sandbox\n")


@pytest.mark.parametrize(
    "change",
    [_byte, _mode, _dir_mode, _symlink_target, _owner, _rename, _new_empty_dir, _file_to_symlink],
)
def test_digest_changes_with_the_tree(tmp_path: Path, change: Callable[[Path], None]) -> None:
    if change is _owner and os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    base = summarize(make_tree(tmp_path / "base")).digest
    changed = make_tree(tmp_path / "changed")
    change(changed)
    assert summarize(changed).digest != base


def test_hard_links_are_counted_once_in_size(tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    (root / "a").write_bytes(b"x" * 1000)
    os.link(root / "a", root / "b")
    assert summarize(root).size_bytes == 1000


def test_symlinks_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"y" * 5000)
    root = tmp_path / "t"
    root.mkdir()
    (root / "link").symlink_to(outside)
    before = summarize(root)
    (outside / "big").write_bytes(b"z" * 5000)
    assert summarize(root) == before
    assert before.size_bytes == 0
