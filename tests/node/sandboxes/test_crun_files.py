"""File calls on real containers, under crun and under runc: made inside the sandbox by
its init, as the user they name (the harness is not a deputy), charged to the sandbox,
streamed, paged, and refused clearly when the sandbox cannot take them."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from node.sandboxes.base import (
    DiskFull,
    PathNotFound,
    PermissionDenied,
    RootImage,
    SandboxNotRunning,
    SandboxPathError,
    SandboxUnresponsive,
)
from node.sandboxes.crun import fileops
from node.sandboxes.crun import spawn as spawner
from node.sandboxes.crun.backend import CrunBackend
from tests.node.sandboxes.conftest import (
    cgroup_file,
    chunks_of,
    make_rootfs,
    read_file,
    spec,
    started_backend,
    write_file,
)
from tests.node.sandboxes.test_crun import run
from wire.sandboxes import ExecRequest

pytestmark = pytest.mark.crun

#: a character device no driver of this kernel serves: opening it fails with ENXIO
UNSERVED_DEVICE = os.makedev(240, 0)


@pytest_asyncio.fixture(params=["crun", "runc"])
async def box(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[CrunBackend]:
    """This module's tests run on both OCI runtimes."""
    async with started_backend(tmp_path / "data", runtime=request.param) as backend:
        assert backend.runtime == request.param
        yield backend


async def sh(backend: CrunBackend, sandbox_id: str, script: str, user: str = "user") -> str:
    result = await run(backend, sandbox_id, ["sh", "-c", script], user=user)
    assert result.exit_code == 0, result
    return result.stdout.decode()


def shmem(sandbox_id: str) -> int:
    """The tmpfs pages charged to the sandbox's memory cgroup (its writable layer's)."""
    stats = cgroup_file("memory", sandbox_id, "memory.stat").splitlines()
    return int(dict(line.split() for line in stats)["shmem"])


def rss() -> int:
    """This process's resident memory now (the node's: the test is the node)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_the_reviews_symlinks_are_the_users_permission_denied(
    box: CrunBackend, busybox_image: RootImage
) -> None:
    """The review's reproduction #7: an agent points ~/notes.txt at /etc/passwd and
    ~/answer.txt at root's secret; the harness's routine write and read as the default
    user fail, and /etc/passwd is neither changed nor given away."""
    await box.create(spec("sbx-deputy"), busybox_image)
    await sh(box, "sbx-deputy", "echo hidden > /root/.secret; chmod 600 /root/.secret", "root")
    passwd = await sh(box, "sbx-deputy", "cat /etc/passwd", "root")
    await sh(box, "sbx-deputy", "ln -s /etc/passwd ~/notes.txt; ln -s /root/.secret ~/answer.txt")
    with pytest.raises(PermissionDenied, match=r"/home/user/notes\.txt"):
        await write_file(box, "sbx-deputy", "/home/user/notes.txt", b"user:x:0:0::/:/bin/sh\n")
    with pytest.raises(PermissionDenied):
        await read_file(box, "sbx-deputy", "/home/user/answer.txt")
    assert await sh(box, "sbx-deputy", "cat /etc/passwd", "root") == passwd
    assert await sh(box, "sbx-deputy", "stat -c '%u %g %a' /etc/passwd", "root") == "0 0 644\n"
    assert (await run(box, "sbx-deputy", ["id", "-u"])).stdout.decode() == "1000\n"
    # root may, as root may inside
    assert await read_file(box, "sbx-deputy", "/home/user/answer.txt", user="root") == b"hidden\n"


async def test_a_remove_or_a_move_through_a_planted_symlink_is_the_users_permission_denied(
    box: CrunBackend, busybox_image: RootImage
) -> None:
    """The agent points ~/etc at /etc: the harness's remove and move as the default user
    meet the link as that user would, so /etc/passwd is neither removed, taken away nor
    replaced; removing the link itself removes the link, never what it points at."""
    await box.create(spec("sbx-links-rm"), busybox_image)
    passwd = await sh(box, "sbx-links-rm", "cat /etc/passwd", "root")
    await sh(box, "sbx-links-rm", "ln -s /etc ~/etc; echo mine > ~/mine")
    with pytest.raises(PermissionDenied):
        await box.remove("sbx-links-rm", "/home/user/etc/passwd", user="user")
    with pytest.raises(PermissionDenied):
        await box.move("sbx-links-rm", "/home/user/etc/passwd", "/home/user/taken", user="user")
    with pytest.raises(PermissionDenied):
        await box.move("sbx-links-rm", "/home/user/mine", "/home/user/etc/passwd", user="user")
    assert await sh(box, "sbx-links-rm", "cat /etc/passwd", "root") == passwd
    await box.remove("sbx-links-rm", "/home/user/etc", user="user")
    left = await sh(box, "sbx-links-rm", "ls /home/user; cat /etc/passwd", "root")
    assert left == "mine\n" + passwd


async def test_no_call_changes_the_owner_of_a_file_it_did_not_create(
    box: CrunBackend, busybox_image: RootImage
) -> None:
    await box.create(spec("sbx-owners"), busybox_image)
    await sh(box, "sbx-owners", "echo mine > ~/mine.txt; chmod 666 ~/mine.txt")
    await sh(box, "sbx-owners", "echo root > /tmp/root.txt; chmod 666 /tmp/root.txt", "root")
    over_user = await write_file(box, "sbx-owners", "/home/user/mine.txt", b"x", user="root")
    over_root = await write_file(box, "sbx-owners", "/tmp/root.txt", b"y", user="user")
    assert (over_user.owner, over_user.size) == ("1000", 1)
    assert (over_root.owner, over_root.group, over_root.size) == ("0", "0", 1)
    made_by_root = await write_file(box, "sbx-owners", "/tmp/new/by-root", b"r", user="root")
    made_by_user = await write_file(box, "sbx-owners", "/tmp/new2/by-user", b"u", mode=0o600)
    assert (made_by_root.owner, made_by_user.owner, made_by_user.mode) == ("0", "1000", 0o600)
    parents = await box.stat("sbx-owners", "/tmp/new2", user="user")
    assert (parents.owner, parents.mode) == ("1000", 0o755)
    moved = await box.move("sbx-owners", "/tmp/root.txt", "/tmp/moved.txt", user="root")
    assert moved.owner == "0"
    assert (await sh(box, "sbx-owners", "stat -c %u ~/mine.txt /tmp/moved.txt")).split() == [
        "1000",
        "0",
    ]


async def test_uploads_are_charged_to_the_sandbox_and_fail_when_it_is_full(
    box: CrunBackend, busybox_image: RootImage
) -> None:
    blob = b"u" * (7 << 20)
    await box.create(spec("sbx-charged", memory_mb=64, disk_mb=512), busybox_image)
    before = shmem("sbx-charged")
    for i in range(3):
        await write_file(box, "sbx-charged", f"/home/user/u{i}", blob)
    assert shmem("sbx-charged") - before >= 3 * len(blob)  # the tmpfs pages are the sandbox's
    accepted = 3 * len(blob)
    with pytest.raises(DiskFull):
        for i in range(3, 20):  # 140 MiB into a sandbox of 64: refused on the way
            await write_file(box, "sbx-charged", f"/home/user/u{i}", blob)
            accepted += len(blob)
    assert accepted <= 64 << 20
    limit = int(cgroup_file("memory", "sbx-charged", "memory.limit_in_bytes"))
    assert int(cgroup_file("memory", "sbx-charged", "memory.max_usage_in_bytes")) <= limit
    # uploads stop short of the limit: the sandbox's init is never the OOM killer's only
    # choice, so the sandbox outlives any number of refused uploads
    for i in range(20, 40):
        with pytest.raises(DiskFull):
            await write_file(box, "sbx-charged", f"/home/user/u{i}", blob)
    assert (await sh(box, "sbx-charged", "echo alive")).strip() == "alive"
    assert (await box.stat("sbx-charged", "/home/user/u0", user="user")).size == len(blob)

    await box.create(spec("sbx-small-disk", memory_mb=128, disk_mb=16), busybox_image)
    with pytest.raises(DiskFull):
        await write_file(box, "sbx-small-disk", "/home/user/big", b"d" * (20 << 20))


async def test_a_large_sparse_file_streams_with_the_nodes_memory_flat(
    box: CrunBackend, busybox_image: RootImage
) -> None:
    await box.create(spec("sbx-sparse", disk_mb=16), busybox_image)
    await sh(box, "sbx-sparse", "dd of=/tmp/sparse bs=1M seek=200 count=0 2>/dev/null")
    stream = await box.read_file("sbx-sparse", "/tmp/sparse", user="user", max_bytes=256 << 20)
    assert stream.size == 200 << 20
    start, peak, total = rss(), 0, 0
    try:
        async for chunk in stream.chunks():
            total += len(chunk)
            assert len(chunk) <= fileops.CHUNK_BYTES
            peak = max(peak, rss())
    finally:
        await stream.close()
    assert total == 200 << 20
    assert peak - start < 32 << 20, (peak - start) >> 20  # a memory bound, not a timing


async def test_a_listing_comes_in_pages_that_walk_every_entry_once(
    box: CrunBackend, busybox_image: RootImage
) -> None:
    await box.create(spec("sbx-pages", disk_mb=64), busybox_image)
    await sh(
        box,
        "sbx-pages",
        "mkdir -p ~/d/sub ~/d/zz; i=0; while [ $i -lt 2500 ]; do : > ~/d/f$i; i=$((i+1)); done;"
        " : > ~/d/sub/inner; : > ~/d/zz/last",
    )
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = await box.list_dir(
            "sbx-pages", "/home/user/d", user="user", depth=2, limit=1000, cursor=cursor
        )
        assert len(page.entries) <= 1000
        seen += [e.path for e in page.entries]
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    expected = ["sub", "sub/inner", "zz", "zz/last", *(f"f{i}" for i in range(2500))]
    assert sorted(seen) == sorted(f"/home/user/d/{name}" for name in expected)
    assert len(seen) == len(set(seen)) == 2504 and pages == 3
    assert seen.index("/home/user/d/sub") + 1 == seen.index("/home/user/d/sub/inner")
    small = await box.list_dir("sbx-pages", "/home/user/d/zz", user="user")
    assert [e.name for e in small.entries] == ["last"] and small.next_cursor is None
    with pytest.raises(ValueError):
        await box.list_dir("sbx-pages", "/home/user/d", user="user", cursor="../../etc")


async def test_a_device_node_is_refused_without_being_opened(
    box: CrunBackend, tmp_path: Path
) -> None:
    """A device in the image: refused because it is no regular file (opening it would
    have failed differently: no driver serves it, and the sandbox may use no device)."""
    root = make_rootfs(tmp_path / "image" / "rootfs")
    (root / "opt").mkdir()
    os.mknod(root / "opt" / "device", stat.S_IFCHR | 0o666, UNSERVED_DEVICE)
    image = RootImage(digest="sha256:" + "d" * 64, rootfs=root)
    await box.create(spec("sbx-device"), image)
    for user in ("user", "root"):
        with pytest.raises(SandboxPathError, match="not a regular file"):
            await read_file(box, "sbx-device", "/opt/device", user=user)
        with pytest.raises(SandboxPathError, match="not a regular file"):
            await write_file(box, "sbx-device", "/opt/device", b"x", user=user)
    assert (await box.stat("sbx-device", "/opt/device", user="user")).type.value == "other"


async def test_file_calls_on_a_paused_sandbox_are_refused_at_once(
    box: CrunBackend, busybox_image: RootImage
) -> None:
    await box.create(spec("sbx-paused"), busybox_image)
    await write_file(box, "sbx-paused", "/home/user/a", b"a")
    await box.pause("sbx-paused")
    calls = [
        read_file(box, "sbx-paused", "/home/user/a"),
        write_file(box, "sbx-paused", "/home/user/b", b"b"),
        box.list_dir("sbx-paused", "/home/user", user="user"),
        box.stat("sbx-paused", "/home/user/a", user="user"),
        box.make_dir("sbx-paused", "/home/user/c", user="user"),
        box.remove("sbx-paused", "/home/user/a", user="user"),
        box.move("sbx-paused", "/home/user/a", "/home/user/d", user="user"),
        box.watch_dir("sbx-paused", "/home/user", user="user"),
    ]
    for call in calls:
        with pytest.raises(SandboxNotRunning, match="paused"):
            await asyncio.wait_for(call, 5)  # a guard against a hang, not a timing
    await box.resume("sbx-paused")
    assert await read_file(box, "sbx-paused", "/home/user/a") == b"a"


async def test_an_init_that_does_not_answer_fails_calls_and_commands_in_bounded_time(
    box: CrunBackend, busybox_image: RootImage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fileops, "ANSWER_S", 0.5)
    monkeypatch.setattr(spawner, "START_S", 0.5)
    await box.create(spec("sbx-silent"), busybox_image)
    state = await box._runtime_json("state", "sbx-silent")
    init = int(state["pid"])
    os.kill(init, signal.SIGSTOP)  # as if wedged
    try:
        with pytest.raises(SandboxUnresponsive, match="did not answer"):
            await asyncio.wait_for(box.stat("sbx-silent", "/tmp", user="user"), 10)
        with pytest.raises(SandboxUnresponsive, match="did not start the command"):
            await asyncio.wait_for(run(box, "sbx-silent", ["true"]), 10)
    finally:
        os.kill(init, signal.SIGCONT)
    assert (await box.stat("sbx-silent", "/tmp", user="user")).type.value == "dir"
    assert (await run(box, "sbx-silent", ["echo", "back"])).stdout.decode() == "back\n"


async def test_a_sandbox_out_of_processes_refuses_file_calls_clearly(
    box: CrunBackend, busybox_image: RootImage
) -> None:
    await box.create(spec("sbx-nopids", pids=16), busybox_image)
    sleeper = ExecRequest(cmd=["sleep", "1000"], timeout_s=None)
    while cgroup_file("pids", "sbx-nopids", "pids.current").strip() != "16":
        await box.exec("sbx-nopids", sleeper, default_user="user")  # one pid each
    with pytest.raises(SandboxUnresponsive, match="processes may be at their limit"):
        await box.stat("sbx-nopids", "/tmp", user="user")
    with pytest.raises(SandboxUnresponsive, match="processes may be at their limit"):
        await run(box, "sbx-nopids", ["true"])


async def test_a_user_watches_only_what_it_may_read(
    box: CrunBackend, busybox_image: RootImage
) -> None:
    await box.create(spec("sbx-watched"), busybox_image)
    await sh(box, "sbx-watched", "mkdir -m 700 /srv; mkdir -m 700 /srv/private", "root")
    with pytest.raises(PermissionDenied):
        await box.watch_dir("sbx-watched", "/srv/private", user="user")
    watch = await box.watch_dir("sbx-watched", "/srv/private", user="root")
    try:
        await sh(box, "sbx-watched", "touch /srv/private/made", "root")
        await asyncio.sleep(0.05)  # the node's loop reads the inotify descriptor
        assert {e.name for e in watch.drain().events} == {"made"}
    finally:
        watch.close()


async def test_names_mean_the_images_users_whatever_the_sandbox_writes_in_its_passwd(
    box: CrunBackend, busybox_image: RootImage
) -> None:
    await box.create(spec("sbx-passwd"), busybox_image)
    await sh(
        box,
        "sbx-passwd",
        "echo 'user:x:0:0::/root:/bin/sh' > /etc/passwd; "
        "echo 'bob:x:2000:2000::/tmp:/bin/sh' >> /etc/passwd",
        "root",
    )
    assert (await run(box, "sbx-passwd", ["id", "-u"])).stdout.decode() == "1000\n"
    assert (await write_file(box, "sbx-passwd", "/tmp/by-user", b"u")).owner == "1000"
    # a user the sandbox added is found in its own passwd
    assert (await run(box, "sbx-passwd", ["id", "-u"], user="bob")).stdout.decode() == "2000\n"
    assert (await write_file(box, "sbx-passwd", "/tmp/by-bob", b"b", user="bob")).owner == "2000"
    assert (await box.stat("sbx-passwd", "/tmp/by-bob", user="3000:3000")).owner == "2000"
    with pytest.raises(SandboxPathError, match="no user 'nobody-here'"):
        await box.stat("sbx-passwd", "/tmp", user="nobody-here")


async def test_an_abandoned_upload_is_not_committed_and_leaks_nothing(
    box: CrunBackend, busybox_image: RootImage
) -> None:
    await box.create(spec("sbx-abandon"), busybox_image)
    await write_file(box, "sbx-abandon", "/home/user/keep", b"kept")  # warms every path
    fds = len(os.listdir("/proc/self/fd"))

    async def cut() -> AsyncIterator[bytes]:
        yield b"partial"
        raise ConnectionResetError("the client went away")

    with pytest.raises(ConnectionResetError):
        await box.write_file("sbx-abandon", "/home/user/cut", cut(), user="user")
    stream = await box.read_file("sbx-abandon", "/home/user/keep", user="user", max_bytes=10)
    await stream.close()  # opened, never read
    with pytest.raises(PathNotFound):
        await read_file(box, "sbx-abandon", "/home/user/none")
    assert len(os.listdir("/proc/self/fd")) == fds
    assert await read_file(box, "sbx-abandon", "/home/user/keep") == b"kept"
    big = await write_file(box, "sbx-abandon", "/home/user/big", b"b" * (3 << 20))
    assert big.size == 3 << 20
    assert b"".join([c async for c in chunks_of(b"b" * (3 << 20))]) == await read_file(
        box, "sbx-abandon", "/home/user/big", max_bytes=4 << 20
    )
