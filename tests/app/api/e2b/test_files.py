"""The ``e2b`` SDK's filesystem (Connect-RPC and /files), unchanged, on crun."""

from __future__ import annotations

import io
import time

import pytest
from e2b import FileType, NotFoundException, Sandbox

from tests.app.api.e2b.conftest import Corral

pytestmark = [pytest.mark.crun, pytest.mark.slow]


def test_files_write_read_list_stat_move_and_remove(corral: Corral) -> None:
    sbx = Sandbox.create(template="python", timeout=120)
    try:
        files = sbx.files
        info = files.write("notes/a.txt", "héllo\n")
        assert (info.name, info.path, info.type) == (
            "a.txt",
            "/home/user/notes/a.txt",
            FileType.FILE,
        )
        assert files.read("/home/user/notes/a.txt") == "héllo\n"
        assert sbx.commands.run("cat notes/a.txt; stat -c %U notes/a.txt").stdout == "héllo\nuser\n"

        blob = bytes(range(256)) * 64
        files.write("/tmp/blob.bin", io.BytesIO(blob))  # streamed, octet-stream
        assert bytes(files.read("/tmp/blob.bin", format="bytes")) == blob
        files.write_files(
            [{"path": "/tmp/m/1.txt", "data": "one"}, {"path": "/tmp/m/2.txt", "data": b"two"}]
        )
        assert sorted(e.name for e in files.list("/tmp/m")) == ["1.txt", "2.txt"]

        assert files.make_dir("/tmp/made/deep") is True
        assert files.make_dir("/tmp/made/deep") is False
        entries = {e.name: e for e in files.list("/tmp")}
        assert entries["made"].type == FileType.DIR and entries["blob.bin"].size == len(blob)
        assert entries["made"].permissions.startswith("d")
        assert [e.path for e in files.list("/tmp/made", depth=2)] == ["/tmp/made/deep"]

        stat = files.get_info("notes/a.txt")
        assert stat.size == len("héllo\n".encode()) and stat.type == FileType.FILE
        assert files.exists("notes/a.txt") and not files.exists("notes/none.txt")

        moved = files.rename("notes/a.txt", "notes/b.txt")
        assert moved.path == "/home/user/notes/b.txt"
        files.remove("notes")
        assert not files.exists("notes/b.txt")
        with pytest.raises(NotFoundException):
            files.read("notes/b.txt")
        with pytest.raises(NotFoundException):
            files.get_info("/no/such/file")

        as_root = files.write("/root/secret.txt", "r", user="root")
        assert as_root.path == "/root/secret.txt"
        assert sbx.commands.run("stat -c %U /root/secret.txt", user="root").stdout == "root\n"
    finally:
        sbx.kill()


def test_watch_dir_reports_changes_and_stops(corral: Corral) -> None:
    from e2b import FilesystemEventType, SandboxException

    sbx = Sandbox.create(template="python", timeout=120)
    try:
        handle = sbx.files.watch_dir("/home/user")
        sbx.files.write("/home/user/watched.txt", "one")
        sbx.commands.run("echo two >> watched.txt; mv watched.txt kept.txt; rm kept.txt")
        time.sleep(0.2)
        seen = {(e.name, e.type) for e in handle.get_new_events()}
        for expected in [
            ("watched.txt", FilesystemEventType.CREATE),
            ("watched.txt", FilesystemEventType.WRITE),
            ("watched.txt", FilesystemEventType.RENAME),
            ("kept.txt", FilesystemEventType.CREATE),
            ("kept.txt", FilesystemEventType.REMOVE),
        ]:
            assert expected in seen, seen
        assert handle.get_new_events() == []
        handle.stop()
        with pytest.raises(SandboxException, match="recursive watching is not supported"):
            sbx.files.watch_dir("/home/user", recursive=True)
    finally:
        sbx.kill()


async def test_the_async_sdk_streams_watch_events(corral: Corral) -> None:
    import asyncio

    from e2b import AsyncSandbox, FilesystemEvent

    sbx = await AsyncSandbox.create(template="python", timeout=120)
    try:
        events: list[FilesystemEvent] = []
        handle = await sbx.files.watch_dir("/tmp", on_event=events.append)
        await sbx.files.write("/tmp/streamed.txt", "x")
        for _ in range(50):
            if any(e.name == "streamed.txt" for e in events):
                break
            await asyncio.sleep(0.1)
        assert any(e.name == "streamed.txt" for e in events), events
        await handle.stop()
    finally:
        await sbx.kill()


def test_the_reviews_symlinks_get_permission_denied_through_the_sdk(corral: Corral) -> None:
    """The review's reproduction #7 as it was run: the agent's symlinks, then the
    harness's routine ``files.write`` and ``files.read`` as the default user."""
    from e2b import SandboxException

    sbx = Sandbox.create(template="python", timeout=120)
    try:
        sbx.commands.run("echo hidden > /root/.secret; chmod 600 /root/.secret", user="root")
        passwd = sbx.commands.run("cat /etc/passwd").stdout
        sbx.commands.run("ln -s /etc/passwd ~/notes.txt; ln -s /root/.secret ~/answer.txt")
        with pytest.raises(SandboxException, match="ermission denied"):
            sbx.files.write("/home/user/notes.txt", "user:x:0:0::/home/user:/bin/bash\n")
        with pytest.raises(SandboxException, match="ermission denied"):
            sbx.files.read("/home/user/answer.txt")
        with pytest.raises(SandboxException, match="ermission denied"):
            sbx.files.list("/root")
        assert sbx.commands.run("cat /etc/passwd").stdout == passwd
        seen = sbx.commands.run("stat -c %U /etc/passwd; id -u").stdout
        assert seen == "root\n1000\n"
        assert sbx.files.read("/home/user/answer.txt", user="root") == "hidden\n"
    finally:
        sbx.kill()


def test_a_listing_past_the_cap_is_refused_not_cut(
    corral: Corral, monkeypatch: pytest.MonkeyPatch
) -> None:
    from e2b import SandboxException

    from app.api.e2b import envd

    monkeypatch.setattr(envd, "LIST_CAP", 1500)  # the server runs in this process
    sbx = Sandbox.create(template="python", timeout=120)
    try:
        sbx.commands.run("mkdir d && cd d && for i in $(seq 1400); do : > f$i; done")
        assert len(sbx.files.list("/home/user/d")) == 1400  # two node pages, gathered
        sbx.commands.run("cd d && for i in $(seq 1401 1600); do : > f$i; done")
        with pytest.raises(SandboxException, match="more than 1500 entries"):
            sbx.files.list("/home/user/d")
    finally:
        sbx.kill()


def test_large_multipart_uploads_stream_to_the_sandbox(corral: Corral) -> None:
    sbx = Sandbox.create(template="python", timeout=120)
    try:
        blob = bytes(range(256)) * (3 << 12)  # 3 MiB: many chunks of the body
        sbx.files.write_files(
            [{"path": "/tmp/up/one.bin", "data": blob}, {"path": "/tmp/up/two.txt", "data": "2"}]
        )
        assert bytes(sbx.files.read("/tmp/up/one.bin", format="bytes")) == blob
        assert sbx.files.read("/tmp/up/two.txt") == "2"
        assert sbx.commands.run("stat -c %U /tmp/up/one.bin").stdout == "user\n"
    finally:
        sbx.kill()
