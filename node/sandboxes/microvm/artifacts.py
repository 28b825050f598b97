"""What a microVM boots from, built on the node and cached by content digest.

``Artifacts(root)`` (root: ``var/microvm``) makes

* ``kernel()``: the PVH ``vmlinux`` (an ELF QEMU's ``-kernel`` boots directly) taken out of
  the installed ``linux-image-cloud-amd64`` kernel's bzImage;
* ``initramfs(agent)``: busybox-static, the virtio modules, resize2fs and the agent, with
  the ``/init`` of ``initramfs.py``;
* ``base_disk(image)``: the image's root file system as a read-only raw ext4 file, made
  with ``mkfs.ext4 -d`` (no mount, ownership and modes kept);
* ``overlay(base, path, size)``: a sandbox's qcow2 disk over a base (its disk limit).

Every cached file is built under a temporary name in its directory and renamed into place
(under a lock file, so two processes build it once); the calls block (run them in a
thread from async code).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import lzma
import os
import re
import shutil
import struct
import subprocess
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from node.sandboxes.base import RootImage, SandboxError, Unsupported
from node.sandboxes.microvm.initramfs import (
    GUEST_MODULES,
    INIT_SCRIPT,
    TOOLS,
    Member,
    gzip_cpio,
    module_order,
)

log = logging.getLogger(__name__)

KERNEL_FLAVOUR = "cloud-amd64"
BUSYBOX = Path("/bin/busybox")
RESIZE2FS = Path("/sbin/resize2fs")
MIB = 1 << 20
#: the smallest base disk, and the room a base keeps free over its content
MIN_DISK_BYTES = 64 * MIB
HEADROOM_BYTES = 32 * MIB
#: the largest disk a base's file system can grow to online (the group descriptors
#: mkfs reserves for it)
MAX_DISK_BYTES = 1 << 40


class ArtifactError(SandboxError):
    """A guest artifact (kernel, initramfs, disk) could not be made on this node."""

    status, code = 503, "backend_unavailable"


def find_kernel(boot: Path = Path("/boot"), flavour: str = KERNEL_FLAVOUR) -> tuple[str, Path]:
    """The newest installed kernel of ``flavour``: (its version, its ``vmlinuz``)."""
    found = []
    for path in boot.glob(f"vmlinuz-*-{flavour}"):
        version = path.name.removeprefix("vmlinuz-")
        key = tuple(int(n) for n in re.findall(r"\d+", version))
        found.append((key, version, path))
    if not found:
        raise ArtifactError(f"no {flavour} kernel in {boot} (scripts/setup-microvm.sh installs it)")
    _, version, path = max(found)
    return version, path


def extract_vmlinux(bzimage: bytes) -> bytes:
    """The ELF kernel inside a bzImage: the setup header's ``payload_offset`` and
    ``payload_length`` locate the compressed payload (LZ4 legacy, gzip or xz here)."""
    if len(bzimage) < 0x250 or bzimage[0x202:0x206] != b"HdrS":
        raise ArtifactError("not a bzImage (no HdrS setup header)")
    setup_sects = bzimage[0x1F1] or 4
    offset, length = struct.unpack_from("<II", bzimage, 0x248)
    start = (setup_sects + 1) * 512 + offset
    payload = bzimage[start : start + length]
    if len(payload) != length or length < 16:
        raise ArtifactError("the bzImage's payload is truncated")
    if payload.startswith(b"\x02\x21\x4c\x18"):
        # LZ4 legacy frames; the last 4 bytes are the decompressed size (for the kernel's
        # own decompressor), not a frame
        lz4 = shutil.which("lz4")
        if lz4 is None:
            raise ArtifactError("the kernel is LZ4-compressed and lz4 is not installed")
        done = subprocess.run([lz4, "-dc"], input=payload[:-4], capture_output=True, check=False)
        if done.returncode != 0:
            raise ArtifactError(f"lz4 failed: {done.stderr.decode(errors='replace')[:500]}")
        elf = done.stdout
    elif payload.startswith(b"\x1f\x8b"):
        elf = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(payload)
    elif payload.startswith(b"\xfd7zXZ\x00"):
        elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(payload)
    else:
        raise ArtifactError(f"unknown kernel compression (magic {payload[:6].hex()})")
    if not elf.startswith(b"\x7fELF"):
        raise ArtifactError("the kernel's payload is not an ELF file")
    return elf


@contextlib.contextmanager
def _locked(dest: Path) -> Iterator[None]:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(dest.parent / f".{dest.name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def publish(dest: Path, build: Callable[[Path], None], mode: int = 0o444) -> Path:
    """``dest``, built by ``build(tmp)`` unless it exists: ``tmp`` is a fresh name in
    ``dest``'s directory, renamed to ``dest`` once complete (a reader never sees half a
    file); a lock makes a concurrent caller wait for the first build instead of redoing it.
    """
    if dest.exists():
        return dest
    with _locked(dest):
        if dest.exists():
            return dest
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            build(tmp)
            os.chmod(tmp, mode)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
    return dest


def _run(argv: list[str], what: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ArtifactError(f"{what} failed ({done.returncode}): {done.stderr.strip()[-800:]}")
    return done.stdout


def _shared_libraries(binary: Path) -> list[Path]:
    """The shared objects ``binary`` loads (ldd), the dynamic loader included."""
    out = _run(["ldd", str(binary)], f"ldd {binary}")
    libs = []
    for line in out.splitlines():
        match = re.search(r"(/\S+) \(0x", line)
        if match:
            libs.append(Path(match.group(1)))
    return libs


class Artifacts:
    """The guest's kernel, initramfs and disks under ``root`` (``var/microvm``)."""

    def __init__(
        self,
        root: Path,
        *,
        boot: Path = Path("/boot"),
        modules_root: Path = Path("/lib/modules"),
        busybox: Path = BUSYBOX,
        resize2fs: Path = RESIZE2FS,
    ) -> None:
        self.root = root
        self._boot = boot
        self._modules_root = modules_root
        self._busybox = busybox
        self._resize2fs = resize2fs
        self._kernel: tuple[str, Path] | None = None

    @property
    def kernel_version(self) -> str:
        return find_kernel(self._boot)[0]

    def kernel(self) -> Path:
        """The PVH ``vmlinux`` of the installed cloud kernel (extracted once)."""
        version, vmlinuz = find_kernel(self._boot)
        stat = vmlinuz.stat()
        if self._kernel is not None and self._kernel[0] == f"{version}:{stat.st_mtime_ns}":
            return self._kernel[1]
        digest = hashlib.sha256(vmlinuz.read_bytes()).hexdigest()[:16]
        dest = self.root / "kernel" / f"vmlinux-{version}-{digest}"

        def build(tmp: Path) -> None:
            tmp.write_bytes(extract_vmlinux(vmlinuz.read_bytes()))
            log.info("microvm: extracted %s from %s", dest.name, vmlinuz)

        publish(dest, build)
        self._kernel = (f"{version}:{stat.st_mtime_ns}", dest)
        return dest

    def initramfs_members(self, agent: Path, init: str = INIT_SCRIPT) -> list[Member]:
        version, _ = find_kernel(self._boot)
        modules_dir = self._modules_root / version
        try:
            modules = module_order(modules_dir, GUEST_MODULES)
        except (LookupError, OSError) as e:
            raise ArtifactError(f"guest kernel modules: {e}") from e
        top = "bin dev etc etc/corral lib lib/modules newroot proc sys tmp"
        members = [Member(d, 0o755) for d in top.split()]
        members.append(Member("bin/busybox", 0o755, self._busybox.read_bytes()))
        members.append(Member("init", 0o755, init.encode()))
        members.append(Member("etc/mtab", 0o777, target="/proc/mounts"))
        names = []
        for rel in modules:
            name = Path(rel).name
            if not name.endswith(".ko"):
                raise ArtifactError(f"compressed kernel module {rel}: not supported")
            members.append(Member(f"lib/modules/{name}", 0o644, (modules_dir / rel).read_bytes()))
            names.append(name)
        members.append(Member("etc/corral/modules", 0o644, ("\n".join(names) + "\n").encode()))
        members += [Member(TOOLS, 0o755), Member(f"{TOOLS}/lib", 0o755)]
        members.append(Member(f"{TOOLS}/resize2fs", 0o755, self._resize2fs.read_bytes()))
        for lib in _shared_libraries(self._resize2fs):
            data = lib.resolve().read_bytes()
            name = "ld.so" if lib.name.startswith("ld-linux") else lib.name
            members.append(Member(f"{TOOLS}/lib/{name}", 0o755, data))
        members.append(Member("corral-vmagent", 0o755, agent.read_bytes()))
        return members

    def initramfs(self, agent: Path, *, init: str = INIT_SCRIPT) -> Path:
        """The gzip'd cpio of busybox, the modules, resize2fs and ``agent`` (any static
        binary or script the image can run), keyed by the digest of its members."""
        members = self.initramfs_members(agent, init)
        digest = hashlib.sha256()
        for m in members:
            digest.update(json.dumps([m.path, m.mode, m.target]).encode())
            digest.update(hashlib.sha256(m.data or b"").digest())
        dest = self.root / "initramfs" / f"{digest.hexdigest()[:24]}.cpio.gz"

        def build(tmp: Path) -> None:
            tmp.write_bytes(gzip_cpio(members))

        return publish(dest, build)

    def base_disk(self, image: RootImage) -> Path:
        """The image's root file system as a raw ext4 file (read-only, cached by digest):
        content plus ``HEADROOM_BYTES``; a sandbox's overlay may be larger, the guest's
        init grows the file system to it."""
        if image.layers:
            raise Unsupported("microVM disks are made from an image's rootfs only (no layers)")
        name = image.digest.replace(":", "-").replace("/", "_")
        dest = self.root / "disks" / f"{name}.raw"

        def build(tmp: Path) -> None:
            used, count = _tree_size(image.rootfs)
            size = max(MIN_DISK_BYTES, used + used // 4 + HEADROOM_BYTES)
            size = -(-size // MIB) * MIB
            inodes = max(8192, count * 2)
            with open(tmp, "wb") as f:
                f.truncate(size)
            _run(
                [
                    "mkfs.ext4", "-q", "-F", "-t", "ext4", "-L", "corral-root",
                    "-b", "4096", "-m", "0", "-N", str(inodes), "-d", str(image.rootfs),
                    "-E", "root_owner=0:0,lazy_itable_init=0,lazy_journal_init=0,"
                    f"resize={MAX_DISK_BYTES // 4096}",
                    str(tmp),
                ],
                "mkfs.ext4",
            )  # fmt: skip
            log.info(
                "microvm: built the disk of %s (%d MiB, %d files)", image.digest, size >> 20, count
            )

        return publish(dest, build)

    def overlay(self, base: Path, path: Path, size_bytes: int | None = None) -> Path:
        """A sandbox's disk: ``make_overlay``."""
        return make_overlay(base, path, size_bytes)


def make_overlay(base: Path, path: Path, size_bytes: int | None = None) -> Path:
    """A qcow2 file at ``path`` over ``base`` (a raw base disk, or a template's qcow2
    disk), ``size_bytes`` large (at least the base's size; None: the base's)."""
    info = json.loads(
        _run(["qemu-img", "info", "--output=json", str(base)], f"qemu-img info {base}")
    )
    base_size = int(info["virtual-size"])
    fmt = str(info["format"])
    if fmt not in ("raw", "qcow2"):
        raise ArtifactError(f"{base}: unexpected disk format {fmt}")
    size = base_size if size_bytes is None else size_bytes
    if size < base_size:
        raise Unsupported(f"a disk of {size} bytes is smaller than its image's ({base_size} bytes)")
    _run(
        [
            "qemu-img", "create", "-q", "-f", "qcow2", "-F", fmt,
            "-b", str(base.resolve()), str(path), str(size),
        ],
        "qemu-img create",
    )  # fmt: skip
    return path


def _tree_size(root: Path) -> tuple[int, int]:
    """Bytes a copy of the tree needs (blocks of 4 KiB per file, roughly) and its entries."""
    used = 0
    count = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            count += 1
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            used += -(-st.st_size // 4096) * 4096 + 4096 * (st.st_size == 0)
    return used, count


def main() -> None:
    """``python -m node.sandboxes.microvm.artifacts [ROOT]``: build the kernel (setup)."""
    import sys

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("var/microvm")
    path = Artifacts(root).kernel()
    print(f"setup-microvm: kernel {path}")  # noqa: T201


if __name__ == "__main__":
    main()
