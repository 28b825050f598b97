"""The ``e2b`` SDK's filesystem (Connect-RPC and /files), unchanged, on crun."""

from __future__ import annotations

import io
import time

import pytest
from e2b import FileType, NotFoundException, Sandbox

from tests.app.e2b.conftest import Corral

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
