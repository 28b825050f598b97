"""The ``e2b`` SDK's filesystem (Connect-RPC and /files), unchanged, on crun."""

from __future__ import annotations

import io

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
