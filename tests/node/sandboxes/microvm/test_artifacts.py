"""The guest's artifacts: the kernel's extraction, the module order, the initramfs's
archive and /init, base disks (ownership kept, read-only, cached) and overlays."""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import shutil
import struct
import subprocess
import time
import zlib
from pathlib import Path

import pytest

from node.sandboxes.base import RootImage, Unsupported
from node.sandboxes.microvm.artifacts import (
    ArtifactError,
    Artifacts,
    extract_vmlinux,
    find_kernel,
    make_overlay,
    publish,
)
from node.sandboxes.microvm.initramfs import GUEST_MODULES, Member, cpio_newc, module_order
from tests.node.sandboxes.conftest import make_rootfs
from tests.requirements import missing, require_tool

ELF = b"\x7fELF" + bytes(range(256)) * 64


def fake_bzimage(payload: bytes) -> bytes:
    """A bzImage's setup header around ``payload`` (what extract_vmlinux reads)."""
    setup_sects = 4
    image = bytearray((setup_sects + 1) * 512)
    image[0x1F1] = setup_sects
    image[0x202:0x206] = b"HdrS"
    struct.pack_into("<II", image, 0x248, 100, len(payload))
    return bytes(image) + b"\0" * 100 + payload + b"trailer"


def test_the_elf_kernel_comes_out_of_a_gzip_or_lz4_payload() -> None:
    gz = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    assert extract_vmlinux(fake_bzimage(gz.compress(ELF) + gz.flush())) == ELF
    lz4 = require_tool("lz4", "scripts/setup-microvm.sh")
    # the kernel's LZ4 payload: legacy frames, then the decompressed size
    framed = subprocess.run([lz4, "-l", "-c"], input=ELF, capture_output=True, check=True)
    payload = framed.stdout + struct.pack("<I", len(ELF))
    assert extract_vmlinux(fake_bzimage(payload)) == ELF


@pytest.mark.parametrize(
    ("image", "error"),
    [
        (b"MZ" + bytes(0x300), "not a bzImage"),
        (fake_bzimage(b"\x00\x01" * 20), "unknown kernel compression"),
        (fake_bzimage(gzip.compress(b"not an elf at all")), "not an ELF"),
    ],
)
def test_what_is_not_a_kernel_is_refused(image: bytes, error: str) -> None:
    with pytest.raises(ArtifactError, match=error):
        extract_vmlinux(image)


def test_the_installed_cloud_kernel_is_found_and_its_modules_ordered() -> None:
    try:
        version, vmlinuz = find_kernel()
    except ArtifactError as e:
        missing(str(e))
    assert version.endswith("-cloud-amd64") and vmlinuz.exists()
    order = module_order(Path("/lib/modules") / version, GUEST_MODULES)
    names = [Path(p).name for p in order]
    # dependencies before what needs them, each once
    assert len(names) == len(set(names))
    for need, user in [("virtio_ring.ko", "virtio.ko"), ("virtio.ko", "virtio_mmio.ko")]:
        if need in names and user in names:
            assert names.index(need) < names.index(user)
    assert {"virtio_console.ko", "virtio_blk.ko"} <= set(names)


def test_module_order_follows_dependencies_and_skips_builtins(tmp_path: Path) -> None:
    (tmp_path / "modules.dep").write_text(
        "kernel/a.ko: kernel/b.ko kernel/c.ko\nkernel/b.ko: kernel/c.ko\nkernel/c.ko:\n"
    )
    (tmp_path / "modules.builtin").write_text("kernel/fs/ext4.ko\n")
    assert module_order(tmp_path, ["a", "ext4"]) == ["kernel/c.ko", "kernel/b.ko", "kernel/a.ko"]
    with pytest.raises(LookupError, match="nosuch"):
        module_order(tmp_path, ["nosuch"])


def test_the_cpio_archive_unpacks_with_its_modes_and_links(tmp_path: Path) -> None:
    busybox = require_tool("busybox", "apt busybox-static")
    archive = cpio_newc(
        [
            Member("bin", 0o755),
            Member("bin/tool", 0o750, b"#!/bin/sh\necho hi\n"),
            Member("bin/link", 0o777, target="tool"),
            Member("odd", 0o644, b"x" * 5),
        ]
    )
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run([busybox, "cpio", "-id"], input=archive, cwd=out, check=True)
    assert (out / "bin" / "tool").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert (out / "bin" / "tool").stat().st_mode & 0o777 == 0o750
    assert os.readlink(out / "bin" / "link") == "tool"
    assert (out / "odd").read_bytes() == b"xxxxx"


def _build_once(dest: str, counter: str) -> None:
    def build(tmp: Path) -> None:
        with open(counter, "a") as f:
            f.write("built\n")
        time.sleep(0.3)  # the other process arrives meanwhile
        tmp.write_bytes(b"artifact")

    publish(Path(dest), build)


def test_two_processes_publishing_one_artifact_build_it_once(tmp_path: Path) -> None:
    dest, counter = tmp_path / "cache" / "thing", tmp_path / "count"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_build_once, args=(str(dest), str(counter))) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert dest.read_bytes() == b"artifact"
    assert counter.read_text() == "built\n"
    assert dest.stat().st_mode & 0o777 == 0o444
    # no temporary file is left beside it
    assert [p.name for p in dest.parent.iterdir() if not p.name.endswith(".lock")] == ["thing"]


def test_a_failed_build_leaves_nothing(tmp_path: Path) -> None:
    def build(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise ArtifactError("broken")

    with pytest.raises(ArtifactError):
        publish(tmp_path / "thing", build)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_the_base_disk_keeps_owners_and_modes_and_overlays_are_at_least_as_large(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        missing("making an image with owners other than the test's needs root")
    require_tool("mkfs.ext4", "apt e2fsprogs")
    debugfs = require_tool("debugfs", "apt e2fsprogs")
    require_tool("qemu-img", "scripts/setup-microvm.sh")
    rootfs = make_rootfs(tmp_path / "rootfs")
    (rootfs / "etc" / "secret").chmod(0o600)
    artifacts = Artifacts(tmp_path / "var")
    image = RootImage(digest="sha256:abc", rootfs=rootfs)
    base = artifacts.base_disk(image)
    assert base == tmp_path / "var" / "disks" / "sha256-abc.raw"
    assert base.stat().st_mode & 0o777 == 0o444
    assert artifacts.base_disk(image) == base  # cached
    stat = subprocess.run(
        [debugfs, "-R", "stat /home/user", str(base)], capture_output=True, text=True, check=True
    ).stdout
    assert "User:  1000   Group:  1000" in stat
    secret = subprocess.run(
        [debugfs, "-R", "stat /etc/secret", str(base)], capture_output=True, text=True, check=True
    ).stdout
    assert "Mode:  0600" in secret and "User:     0   Group:     0" in secret
    listing = subprocess.run(
        [debugfs, "-R", "ls -l /bin", str(base)], capture_output=True, text=True, check=True
    ).stdout
    assert "busybox" in listing

    overlay = make_overlay(base, tmp_path / "o.qcow2", base.stat().st_size * 4)
    info = json.loads(
        subprocess.run(
            ["qemu-img", "info", "--output=json", str(overlay)],
            capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    assert info["virtual-size"] == base.stat().st_size * 4
    assert info["backing-filename"] == str(base)
    with pytest.raises(Unsupported):
        make_overlay(base, tmp_path / "small.qcow2", base.stat().st_size // 2)
    assert not (tmp_path / "small.qcow2").exists()
    with pytest.raises(Unsupported):
        artifacts.base_disk(RootImage(digest="sha256:x", rootfs=rootfs, layers=(rootfs,)))
    shutil.rmtree(tmp_path / "var")
