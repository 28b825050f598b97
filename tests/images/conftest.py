"""Small trees and stores for the image tests.

``busybox_tree`` makes a working root filesystem in milliseconds from Debian's
``busybox-static`` (one static binary and its applet links, /etc/passwd with root and
``user``), so tests that run commands in a tree need no debootstrap.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from images import ImageMeta, ImageStore
from tests.requirements import missing, require_tool

BUSYBOX = "/bin/busybox"


def busybox_tree(root: Path) -> Path:
    """A minimal rootfs at ``root`` (created): busybox, passwd/group, the usual dirs."""
    if not os.path.isfile(BUSYBOX):
        require_tool("busybox", "apt-get install busybox-static; scripts/setup-images.sh")
    for d in ("bin", "etc", "proc", "dev", "tmp", "root", "home/user", "usr/bin"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    shutil.copy2(BUSYBOX, root / "bin/busybox")
    applets = subprocess.run(
        [BUSYBOX, "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    for applet in applets:
        link = root / "bin" / applet
        if not link.exists():
            link.symlink_to("busybox")
    (root / "etc/passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"
    )
    (root / "etc/group").write_text("root:x:0:\nuser:x:1000:\n")
    os.chown(root / "home/user", 1000, 1000)
    return root


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "images")


@pytest.fixture
def require_root() -> None:
    if os.geteuid() != 0:
        missing("the image builds need root (chroot, mount namespaces, file owners)")


@pytest.fixture
def busybox_image(store: ImageStore, tmp_path: Path, require_root: None) -> str:
    """A small image named ``base`` in ``store``; returns its digest."""
    tree = busybox_tree(tmp_path / "busybox-src")
    image = store.add(
        tree, ImageMeta(name="base", source="import", env={"PATH": "/bin", "BASE": "1"})
    )
    return image.digest
