"""Fixtures for the sandbox backends: a small busybox root filesystem, a started crun
backend in a private data dir, and a check that nothing a test made outlives it."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from node.sandboxes.base import RootImage, SandboxBackend
from node.sandboxes.crun.backend import CGROUP_PARENT, CrunBackend
from node.sandboxes.crun.uidranges import DEFAULT_REGISTRY
from node.sandboxes.service import image_store_resolver
from tests.requirements import missing
from wire.sandboxes import FileEntry, SandboxSpec

PROJECT_IMAGES = Path(__file__).resolve().parents[3] / "var" / "images"

BUSYBOX_APPLETS = [
    *("sh", "ls", "cat", "echo", "id", "ps", "kill", "sleep", "yes", "head", "tail", "wc"),
    *("touch", "mkdir", "rm", "dd", "ln", "mv", "cp", "env", "pwd", "true", "false", "grep"),
    *("seq", "nc", "ping", "wget", "hostname", "mount", "df", "stat", "chmod", "sync"),
    "mkfifo",
]


def make_rootfs(root: Path) -> Path:
    """A tiny image: busybox, root and ``user`` (1000), /tmp, /home/user."""
    busybox = shutil.which("busybox") or "/bin/busybox"
    for d in ("bin", "etc", "tmp", "root", "home/user", "proc", "sys", "dev"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, root / "bin" / "busybox")
    for applet in BUSYBOX_APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    (root / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n"
    )
    (root / "etc" / "group").write_text("root:x:0:\nuser:x:1000:\n")
    (root / "etc" / "secret").write_text("image-only\n")
    (root / "tmp").chmod(0o1777)
    shutil.chown(root / "home" / "user", 1000, 1000)
    return root


@pytest.fixture(scope="session")
def busybox_image(tmp_path_factory: pytest.TempPathFactory) -> RootImage:
    root = make_rootfs(tmp_path_factory.mktemp("image") / "rootfs")
    return RootImage(digest="sha256:" + "b" * 64, rootfs=root)


@pytest.fixture(scope="session")
def python_image() -> RootImage:
    """The project's default ``python`` image (Debian: python3, util-linux, coreutils)."""
    if not (PROJECT_IMAGES / "names" / "python").exists():
        missing("the python image is not built (scripts/setup-images.sh)")
    return image_store_resolver(PROJECT_IMAGES)("python")


def cgroup_file(controller: str, sandbox_id: str, name: str) -> str:
    """A file of a sandbox's cgroup, read by the host."""
    return (Path("/sys/fs/cgroup") / controller / CGROUP_PARENT / sandbox_id / name).read_text()


def spec(sandbox_id: str, **kw: object) -> SandboxSpec:
    base: dict[str, object] = {
        "sandbox_id": sandbox_id,
        "tenant_id": "ten_test",
        "image": "busybox",
        "memory_mb": 128,
        "disk_mb": 32,
        "pids": 64,
    }
    base.update(kw)
    return SandboxSpec.model_validate(base)


async def read_file(
    backend: SandboxBackend,
    sandbox_id: str,
    path: str,
    *,
    user: str = "user",
    max_bytes: int = 1 << 20,
) -> bytes:
    """A whole file, through the backend's stream."""
    stream = await backend.read_file(sandbox_id, path, user=user, max_bytes=max_bytes)
    try:
        return b"".join([chunk async for chunk in stream.chunks()])
    finally:
        await stream.close()


async def chunks_of(data: bytes, size: int = 1 << 16) -> AsyncIterator[bytes]:
    for at in range(0, len(data), size):
        yield data[at : at + size]


async def write_file(
    backend: SandboxBackend,
    sandbox_id: str,
    path: str,
    data: bytes,
    *,
    user: str = "user",
    mode: int = 0o644,
) -> FileEntry:
    return await backend.write_file(sandbox_id, path, chunks_of(data), user=user, mode=mode)


def leftovers(data_dir: Path, sandbox_id: str) -> list[str]:
    """What of a sandbox is still on the host: mounts, cgroups, files."""
    found: list[str] = []
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    mine = str(data_dir / "sandboxes" / sandbox_id)
    found += [point for point in points if point.startswith(mine + "/")]
    # a root file system still mounted in an id range's directory nobody holds
    for point in points:
        slot, _, rest = point.removeprefix(f"{DEFAULT_REGISTRY}/").partition(".root/")
        if rest and slot.isdigit() and not (DEFAULT_REGISTRY / slot).exists():
            found.append(point)
    for controller in ("memory", "pids", "cpu", "freezer"):
        group = Path("/sys/fs/cgroup") / controller / CGROUP_PARENT / sandbox_id
        if group.exists():
            found.append(str(group))
    if (data_dir / "sandboxes" / sandbox_id).exists():
        found.append(str(data_dir / "sandboxes" / sandbox_id))
    holder = str(data_dir.resolve() / "sandboxes" / sandbox_id)
    if DEFAULT_REGISTRY.is_dir():
        for slot in DEFAULT_REGISTRY.iterdir():
            with contextlib.suppress(OSError):
                if slot.name.isdigit() and slot.read_text() == holder:
                    found.append(f"id range {slot.name}")
    return found


@contextlib.asynccontextmanager
async def started_backend(data_dir: Path, **kw: Any) -> AsyncIterator[CrunBackend]:
    """A started container backend in ``data_dir``; at the end every sandbox it holds is
    destroyed and nothing of any may be left on the host."""
    backend = CrunBackend(data_dir, **kw)
    await backend.start()
    try:
        yield backend
    finally:
        ids = [p.name for p in (data_dir / "sandboxes").iterdir() if p.name[0] != "."]
        ids += await backend.start()  # what the runtime still lists
        for sandbox_id in set(ids):
            await backend.destroy(sandbox_id)
        await backend.close()
        for sandbox_id in set(ids):
            assert not leftovers(data_dir, sandbox_id), "destroy left something"


@pytest_asyncio.fixture
async def crun(tmp_path: Path) -> AsyncIterator[CrunBackend]:
    async with started_backend(tmp_path / "data") as backend:
        yield backend
