"""The container backend on real containers, under crun and under runc: commands, files,
limits, pause, clean-up; and crun that cannot run here falling back to runc."""

from __future__ import annotations

import asyncio
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from node.sandboxes.base import (
    BackendUnavailable,
    PathNotFound,
    RootImage,
    SandboxError,
    SandboxNotFound,
    SandboxNotRunning,
    SandboxPathError,
)
from node.sandboxes.crun.backend import CrunBackend
from tests.node.sandboxes.conftest import (
    cgroup_file,
    leftovers,
    make_rootfs,
    read_file,
    spec,
    started_backend,
    write_file,
)
from wire.sandboxes import ExecExit, ExecRequest, ExecResult, collect

pytestmark = pytest.mark.crun

#: CapEff of root inside a sandbox: bundle.ROOT_CAPABILITIES
ROOT_CAPS = format(
    sum(
        1 << n
        for n in (0, 1, 3, 4, 5, 6, 7, 8, 10, 18, 29, 31)  # CHOWN .. SETFCAP, as listed
    ),
    "016x",
)


@pytest_asyncio.fixture(params=["crun", "runc"])
async def crun(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[CrunBackend]:
    """This module's tests run on both OCI runtimes."""
    async with started_backend(tmp_path / "data", runtime=request.param) as backend:
        assert backend.runtime == request.param
        yield backend


async def run(backend: CrunBackend, sandbox_id: str, cmd: list[str], **kw: Any) -> ExecResult:
    process = await backend.exec(sandbox_id, ExecRequest(cmd=cmd, **kw), default_user="user")
    return await collect(process.events())


async def test_a_command_runs_as_the_user_with_its_env_cwd_and_exit_code(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-cmd", env={"FROM_SPEC": "s"}), busybox_image)
    result = await run(
        crun,
        "sbx-cmd",
        ["sh", "-c", "id -u; pwd; echo $FROM_SPEC $X; echo oops >&2; exit 3"],
        env={"X": "x"},
    )
    assert result.stdout.decode().split() == ["1000", "/home/user", "s", "x"]
    assert result.stderr.decode() == "oops\n" and result.exit_code == 3
    root = await run(crun, "sbx-cmd", ["id", "-u"], user="root", cwd="/tmp")
    assert root.stdout.decode().strip() == "0"
    missing = await run(crun, "sbx-cmd", ["no-such-command"])
    assert missing.exit_code == 127


async def test_state_persists_between_commands(crun: CrunBackend, busybox_image: RootImage) -> None:
    await crun.create(spec("sbx-state"), busybox_image)
    await run(crun, "sbx-state", ["sh", "-c", "echo kept > /home/user/note"])
    assert (await run(crun, "sbx-state", ["cat", "/home/user/note"])).stdout.decode() == "kept\n"


async def test_a_timeout_kills_the_whole_session_background_children_too(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-timeout"), busybox_image)
    result = await run(
        crun, "sbx-timeout", ["sh", "-c", "sleep 300 & sleep 301 & sleep 302"], timeout_s=0.5
    )
    assert result.timed_out and result.signal == signal.SIGKILL
    ps = await run(crun, "sbx-timeout", ["ps", "-o", "args"])
    assert "sleep 30" not in ps.stdout.decode(), ps.stdout.decode()


async def test_output_is_capped_and_a_flood_does_not_stall(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-flood"), busybox_image)
    result = await run(
        crun, "sbx-flood", ["sh", "-c", "yes | head -c 5000000"], max_output_bytes=10_000
    )
    assert (
        result.exit_code == 0 and len(result.stdout.decode()) == 10_000 and result.stdout_truncated
    )


async def test_files_written_read_listed_moved_removed(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-files"), busybox_image)
    entry = await write_file(crun, "sbx-files", "/home/user/a/b.txt", b"hello")
    assert entry.size == 5 and entry.owner == "1000"
    assert (await run(crun, "sbx-files", ["cat", "a/b.txt"])).stdout.decode() == "hello"
    await run(crun, "sbx-files", ["sh", "-c", "echo from-inside > /home/user/c.txt"])
    assert await read_file(crun, "sbx-files", "/home/user/c.txt") == b"from-inside\n"
    page = await crun.list_dir("sbx-files", "/home/user", user="user", depth=2)
    names = [e.path for e in page.entries]
    assert names == ["/home/user/a", "/home/user/a/b.txt", "/home/user/c.txt"]
    assert page.next_cursor is None
    await crun.move("sbx-files", "/home/user/c.txt", "/home/user/d/c.txt", user="user")
    assert (await crun.stat("sbx-files", "/home/user/d/c.txt", user="user")).size == 12
    await crun.remove("sbx-files", "/home/user/a", user="user")
    with pytest.raises(PathNotFound):
        await crun.stat("sbx-files", "/home/user/a/b.txt", user="user")


async def test_symlinks_planted_inside_cannot_reach_the_host(
    crun: CrunBackend, busybox_image: RootImage, tmp_path: Path
) -> None:
    host_secret = tmp_path / "host-secret"
    host_secret.write_text("HOST")
    await crun.create(spec("sbx-links"), busybox_image)
    await run(
        crun,
        "sbx-links",
        [
            "sh",
            "-c",
            f"ln -s {host_secret} /tmp/a; ln -s ../../../../../../{host_secret} /tmp/b;"
            " ln -s /proc/1/root/etc /tmp/c",
        ],
    )
    for link in ("/tmp/a", "/tmp/b"):
        with pytest.raises(PathNotFound):  # resolved inside the sandbox, where it is not
            await read_file(crun, "sbx-links", link, user="root")
    with pytest.raises(SandboxPathError):  # PID 1's root is not the user's to enter
        await read_file(crun, "sbx-links", "/tmp/c/passwd")
    await run(crun, "sbx-links", ["mkdir", "-p", str(tmp_path)], user="root")
    await write_file(crun, "sbx-links", "/tmp/a", b"written", user="root")
    assert host_secret.read_text() == "HOST"  # the write landed inside the sandbox
    assert await read_file(crun, "sbx-links", str(host_secret), user="root") == b"written"


async def test_pause_freezes_and_resume_thaws(crun: CrunBackend, busybox_image: RootImage) -> None:
    await crun.create(spec("sbx-pause"), busybox_image)
    await crun.pause("sbx-pause")
    with pytest.raises(SandboxNotRunning):
        await crun.exec("sbx-pause", ExecRequest(cmd=["true"]), default_user="user")
    assert cgroup_file("freezer", "sbx-pause", "freezer.state").strip() == "FROZEN"
    await crun.resume("sbx-pause")
    assert (await run(crun, "sbx-pause", ["echo", "back"])).stdout.decode() == "back\n"


async def test_a_pause_and_a_resume_start_no_runtime_process_and_the_runtime_agrees(
    crun: CrunBackend, busybox_image: RootImage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm sandbox is paused after every refill: the backend writes the freezer
    itself, where ``crun state`` and ``crun pause`` were two processes per refill (a
    third of its cost); the runtime reads the same file, so it still says paused."""
    await crun.create(spec("sbx-direct"), busybox_image)
    started: list[tuple[str, ...]] = []
    runtime = crun._runtime

    async def counted(*args: str, **kw: Any) -> bytes:
        started.append(args)
        return await runtime(*args, **kw)

    monkeypatch.setattr(crun, "_runtime", counted)
    await crun.pause("sbx-direct")
    assert started == []
    assert (await crun._runtime_json("state", "sbx-direct"))["status"] == "paused"
    started.clear()
    await crun.resume("sbx-direct")
    assert started == []
    assert (await crun._runtime_json("state", "sbx-direct"))["status"] == "running"
    assert (await run(crun, "sbx-direct", ["echo", "on"])).stdout == b"on\n"
    with pytest.raises(SandboxNotFound):
        await crun.pause("sbx-none")


async def test_a_pause_returns_only_once_busy_processes_are_frozen(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    """``crun pause`` only starts the freeze: with busy tasks the group reads FREEZING
    when it returns. The backend's pause is done only when the kernel says FROZEN."""
    await crun.create(spec("sbx-busy"), busybox_image)
    loop = "while :; do echo x > /tmp/f; cat /tmp/f > /dev/null; done"
    for _ in range(4):
        await crun.exec("sbx-busy", ExecRequest(cmd=["sh", "-c", loop]), default_user="user")
    await asyncio.sleep(0.3)
    for _ in range(5):
        await crun.pause("sbx-busy")
        assert cgroup_file("freezer", "sbx-busy", "freezer.state").strip() == "FROZEN"
        await crun.resume("sbx-busy")
        await asyncio.sleep(0.05)
    await crun.destroy("sbx-busy")


async def test_an_exec_that_finds_no_freezer_group_is_refused_and_logged(
    crun: CrunBackend,
    busybox_image: RootImage,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A running sandbox whose freezer group cannot be read (here: looked for under a
    wrong root) is refused with 409, and the node's log says which sandbox, the error and
    whether the group was there."""
    await crun.create(spec("sbx-nofreezer"), busybox_image)
    real = crun._cgroup

    def elsewhere(controller: str, sandbox_id: str) -> Path:
        path = real(controller, sandbox_id)
        return path.with_name(path.name + "-gone") if controller == "freezer" else path

    monkeypatch.setattr(crun, "_cgroup", elsewhere)
    with pytest.raises(SandboxNotRunning, match="its cgroup cannot be read"):
        await run(crun, "sbx-nofreezer", ["true"])
    assert "sandbox=sbx-nofreezer: exec refused" in caplog.text
    assert "No such file or directory" in caplog.text and "group absent" in caplog.text
    monkeypatch.undo()
    assert (await run(crun, "sbx-nofreezer", ["true"])).exit_code == 0


async def test_destroy_releases_mounts_cgroups_and_files(
    crun: CrunBackend, busybox_image: RootImage, tmp_path: Path
) -> None:
    await crun.create(spec("sbx-gone"), busybox_image)
    background = await crun.exec(
        "sbx-gone", ExecRequest(cmd=["sleep", "300"], timeout_s=None), default_user="user"
    )
    assert leftovers(tmp_path / "data", "sbx-gone")  # it exists
    await crun.destroy("sbx-gone")
    assert leftovers(tmp_path / "data", "sbx-gone") == []
    events = [e async for e in background.events()]
    assert isinstance(events[-1], ExecExit)
    await crun.destroy("sbx-gone")  # again: nothing to do, no error
    assert "sbx-gone" not in await crun.start()


async def test_a_node_restart_finds_the_sandboxes_it_left(
    tmp_path: Path, busybox_image: RootImage
) -> None:
    first = CrunBackend(tmp_path / "data")
    await first.start()
    await first.create(spec("sbx-survivor"), busybox_image)
    await first.close()  # the node process ends; the container does not
    second = CrunBackend(tmp_path / "data")
    try:
        assert "sbx-survivor" in await second.start()
        assert (await run(second, "sbx-survivor", ["echo", "still"])).stdout.decode() == "still\n"
    finally:
        await second.destroy("sbx-survivor")
    assert leftovers(tmp_path / "data", "sbx-survivor") == []


async def test_a_failed_create_leaves_nothing(crun: CrunBackend, tmp_path: Path) -> None:
    broken = RootImage(digest="sha256:" + "0" * 64, rootfs=tmp_path / "no-such-rootfs")
    with pytest.raises(OSError):
        await crun.create(spec("sbx-broken"), broken)
    assert leftovers(tmp_path / "data", "sbx-broken") == []


async def test_a_fifo_planted_where_a_file_is_read_does_not_stall_the_node(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-fifo"), busybox_image)
    await run(crun, "sbx-fifo", ["mkfifo", "/tmp/fifo"])
    with pytest.raises(SandboxPathError, match="not a regular file"):
        await asyncio.wait_for(read_file(crun, "sbx-fifo", "/tmp/fifo"), 5)
    with pytest.raises(SandboxPathError):
        await asyncio.wait_for(write_file(crun, "sbx-fifo", "/tmp/fifo", b"x"), 5)


async def test_a_sandbox_the_runtime_cannot_delete_keeps_its_mounts_and_says_so(
    crun: CrunBackend, busybox_image: RootImage, tmp_path: Path
) -> None:
    await crun.create(spec("sbx-stuck"), busybox_image)
    real = crun._bin()
    crun._binary = "/bin/false"  # every runtime command fails, as a wedged runtime would
    try:
        with pytest.raises(SandboxError, match="could not be deleted"):
            await crun.destroy("sbx-stuck")
    finally:
        crun._binary = real
    assert leftovers(tmp_path / "data", "sbx-stuck")  # not unmounted under a live container
    await crun.destroy("sbx-stuck")
    assert leftovers(tmp_path / "data", "sbx-stuck") == []


async def test_crun_that_cannot_run_here_falls_back_to_runc_and_says_so(
    tmp_path: Path, busybox_image: RootImage, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    runc = shutil.which("runc")
    assert runc is not None, "scripts/setup-sandboxes.sh installs runc"
    only_runc = tmp_path / "bin"
    only_runc.mkdir()
    (only_runc / "runc").symlink_to(runc)
    monkeypatch.setenv("PATH", str(only_runc))  # a node without crun
    async with started_backend(tmp_path / "data", runtime="crun") as backend:
        assert backend.runtime == "runc"
        assert "runc" in caplog.text and "crun is not installed" in caplog.text
        await backend.create(spec("sbx-fallback"), busybox_image)
        assert (
            await run(backend, "sbx-fallback", ["echo", "on runc"])
        ).stdout.decode() == "on runc\n"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # neither
    with pytest.raises(BackendUnavailable, match="crun is not installed"):
        await CrunBackend(tmp_path / "data").start()


async def test_commands_come_from_the_sandboxs_init_which_nothing_inside_can_reach(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-spawn"), busybox_image)
    assert (crun.root / "sbx-spawn" / "spawn.sock").is_socket()  # on the host, outside rootfs
    for user, effective in (("user", "0000000000000000"), ("root", ROOT_CAPS)):
        seen = await run(
            crun,
            "sbx-spawn",
            ["sh", "-c", "grep CapEff /proc/self/status; ls /proc/self/fd; cat /proc/self/stat"],
            user=user,
        )
        lines = seen.stdout.decode().splitlines()
        assert lines[0].split()[1] == effective, (user, lines)
        assert sorted(lines[1:-1]) == ["0", "1", "2", "3"], lines  # 3: ls's own directory
        fields = lines[-1].rsplit(")", 1)[1].split()
        assert fields[1] == "1" and fields[3] == lines[-1].split()[0]  # init's child, own session
    hunt = await run(
        crun,
        "sbx-spawn",
        ["sh", "-c", "ls -l /proc/1/fd 2>&1; find / -xdev -type s 2>/dev/null; echo done"],
    )
    assert "socket" not in hunt.stdout.decode() and "spawn" not in hunt.stdout.decode(), (
        hunt.stdout.decode()
    )


async def test_a_sandbox_without_a_spawner_runs_commands_through_the_runtime(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-old"), busybox_image)
    (crun.root / "sbx-old" / "spawn.sock").unlink()  # as a sandbox made before it existed
    result = await run(crun, "sbx-old", ["sh", "-c", "id -u; exit 4"])
    assert result.stdout.decode() == "1000\n" and result.exit_code == 4


async def test_a_watched_directory_reports_what_its_sandbox_does(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-watch"), busybox_image)
    watch = await crun.watch_dir("sbx-watch", "/home/user", user="user")
    try:
        await run(
            crun,
            "sbx-watch",
            ["sh", "-c", "echo a > new; echo b >> new; mv new moved; chmod 600 moved; rm moved"],
        )
        await asyncio.sleep(0.05)  # the node's loop reads the inotify descriptor
        got = watch.drain()
        seen = [(e.name, e.type.value) for e in got.events]
        for expected in [
            ("new", "create"),
            ("new", "write"),
            ("new", "rename"),
            ("moved", "create"),
            ("moved", "chmod"),
            ("moved", "remove"),
        ]:
            assert expected in seen, seen
        assert watch.drain().events == []  # drained
    finally:
        watch.close()


async def test_a_watch_through_a_planted_symlink_stays_in_the_sandbox(
    crun: CrunBackend, busybox_image: RootImage, tmp_path: Path
) -> None:
    await crun.create(spec("sbx-watchlink"), busybox_image)
    await run(crun, "sbx-watchlink", ["ln", "-s", str(tmp_path), "/tmp/escape"])
    # /tmp/escape resolves inside the sandbox, where that host path does not exist
    with pytest.raises(PathNotFound):
        await crun.watch_dir("sbx-watchlink", "/tmp/escape", user="user")
    await run(crun, "sbx-watchlink", ["ln", "-s", "/root", "/tmp/root"], user="root")
    watch = await crun.watch_dir("sbx-watchlink", "/tmp/root", user="root")  # the sandbox's
    try:
        (tmp_path / "host-file").write_text("x")
        await run(crun, "sbx-watchlink", ["touch", "/root/inside"], user="root")
        await asyncio.sleep(0.05)
        names = {e.name for e in watch.drain().events}
        assert names == {"inside"}, names
    finally:
        watch.close()


async def test_a_sandbox_without_network_has_a_resolv_conf_saying_so_in_place_of_the_images(
    crun: CrunBackend, tmp_path: Path
) -> None:
    root = make_rootfs(tmp_path / "image" / "rootfs")
    (root / "etc").chmod(0o751)
    (root / "etc" / "resolv.conf").write_text("nameserver 9.9.9.9\n")  # where it was built
    image = RootImage(digest="sha256:" + "d" * 64, rootfs=root)
    await crun.create(spec("sbx-resolv"), image)
    seen = await run(
        crun,
        "sbx-resolv",
        [
            "sh",
            "-c",
            "stat -c '%u %g %a' /etc /etc/resolv.conf; cat /etc/resolv.conf; "
            "cat /etc/secret; busybox nslookup pypi.org; echo rc=$?",
        ],
    )
    out = seen.stdout.decode() + seen.stderr.decode()
    # the sandbox's root owns them, /etc keeps the image's mode and its other files
    assert out.splitlines()[:2] == ["0 0 751", "0 0 644"], out
    assert "this sandbox has no network" in out and "9.9.9.9" not in out, out
    assert "image-only" in out
    # asked of the loopback, where nothing answers: refused at once, not a timeout
    assert "127.0.0.1" in out and "rc=1" in out, out
    # the image itself is untouched
    assert (root / "etc" / "resolv.conf").read_text() == "nameserver 9.9.9.9\n"
