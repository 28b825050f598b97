"""The node's side of file calls made by a sandbox's init: what comes back is untrusted,
so every answer is bounded and parsed strictly, and every wait ends."""

from __future__ import annotations

import array
import asyncio
import errno
import os
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from node.sandboxes.base import (
    DiskFull,
    FileTooLarge,
    NotADirectory,
    PathExists,
    PathNotFound,
    PermissionDenied,
    SandboxPathError,
    SandboxUnresponsive,
)
from node.sandboxes.crun import fileops
from node.sandboxes.crun.fileops import InitFiles, decode_cursor, encode_cursor
from node.sandboxes.rooted import ROOT

Init = Callable[[socket.socket], Awaitable[None]]


def record(tag: bytes, payload: bytes = b"") -> bytes:
    return tag + struct.pack("<I", len(payload)) + payload


def entry(relative: bytes, *, kind: int = 1, target: bytes = b"") -> bytes:
    head = struct.pack(
        "<BIIIqqIHH", kind, 0o100644, 1000, 1000, 5, 1, 0, len(relative), len(target)
    )
    return head + relative + target


async def serve(tmp_path: Path, init: Init) -> AsyncIterator[InitFiles]:
    """A stand-in for a sandbox's init at ``tmp_path/spawn.sock``: ``init`` answers each
    connection (as a subverted child could)."""
    path = tmp_path / "spawn.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    listener.setblocking(False)
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    async def accept() -> None:
        while True:
            conn, _ = await loop.sock_accept(listener)
            conn.setblocking(False)

            async def one(conn: socket.socket = conn) -> None:
                try:
                    await init(conn)
                finally:
                    conn.close()

            tasks.add(asyncio.create_task(one()))

    acceptor = asyncio.create_task(accept())
    try:
        yield InitFiles(path, "sbx-test")
    finally:
        acceptor.cancel()
        for task in tasks:
            task.cancel()
        listener.close()


async def answering(tmp_path: Path, *answers: bytes) -> AsyncIterator[InitFiles]:
    async def init(conn: socket.socket) -> None:
        await asyncio.get_running_loop().sock_recv(conn, 1 << 16)  # the request
        for answer in answers:
            await asyncio.get_running_loop().sock_sendall(conn, answer)
        await asyncio.sleep(30)

    async for files in serve(tmp_path, init):
        yield files


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fileops, "ANSWER_S", 0.3)
    monkeypatch.setattr(fileops, "WALK_S", 0.3)
    monkeypatch.setattr(fileops, "STALL_S", 0.3)


@pytest.mark.parametrize(
    ("err", "kind"),
    [
        (errno.ENOENT, PathNotFound),
        (errno.EEXIST, PathExists),
        (errno.ENOTDIR, NotADirectory),
        (errno.EACCES, PermissionDenied),
        (errno.EPERM, PermissionDenied),
        (errno.ENOSPC, DiskFull),
        (errno.EFBIG, FileTooLarge),
        (fileops.NOT_REGULAR, SandboxPathError),
        (errno.EIO, SandboxPathError),
        (99999, SandboxUnresponsive),  # no errno: not shown as one
    ],
)
async def test_an_errno_is_mapped_to_the_nodes_own_error(
    tmp_path: Path, err: int, kind: type[Exception]
) -> None:
    async for files in answering(tmp_path, record(b"E", struct.pack("<i", err))):
        with pytest.raises(kind) as raised:
            await files.stat("/tmp/x", ROOT)
        assert "/tmp/x" in str(raised.value) or kind in (DiskFull, SandboxUnresponsive)


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (b"", "without an answer"),  # the child died
        (record(b"E"), "processes may be at their limit"),  # init could not fork
        (record(b"S", b"short"), "short entry"),
        (record(b"S", entry(b"a") + b"extra"), "does not parse"),
        (record(b"X", b"?"), "out of turn"),
        (b"S" + struct.pack("<I", 1 << 30), "oversized"),
        (b"S\0", "did not answer"),  # a record that never ends
    ],
)
async def test_a_broken_or_forged_answer_is_a_clear_error_never_a_hang(
    tmp_path: Path, answer: bytes, says: str
) -> None:
    async def init(conn: socket.socket) -> None:
        await asyncio.get_running_loop().sock_recv(conn, 1 << 16)
        await asyncio.get_running_loop().sock_sendall(conn, answer)
        if says == "did not answer":
            await asyncio.sleep(30)

    async for files in serve(tmp_path, init):
        with pytest.raises(SandboxUnresponsive, match=says):
            await asyncio.wait_for(files.stat("/tmp/x", ROOT), 5)


async def test_a_listing_refuses_paths_outside_the_listed_directory(tmp_path: Path) -> None:
    for forged in (b"../etc/passwd", b"/etc", b"a//b", b"a/./b", b"a\0b"):
        async for files in answering(tmp_path, record(b"S", entry(forged))):
            with pytest.raises(SandboxUnresponsive, match="outside"):
                await files.list_page("/home", ROOT, depth=16, limit=10, cursor=None)
        (tmp_path / "spawn.sock").unlink()
    too_many = record(b"S", entry(b"a")) * 3 + record(b"D", b"\1")
    async for files in answering(tmp_path, too_many):
        with pytest.raises(SandboxUnresponsive, match="out of turn"):
            await files.list_page("/home", ROOT, depth=1, limit=2, cursor=None)


async def test_a_page_and_its_cursor(tmp_path: Path) -> None:
    answers = record(b"S", entry(b"a")) + record(b"S", entry(b"a/b", kind=2)) + record(b"D", b"\1")
    async for files in answering(tmp_path, answers):
        page = await files.list_page("/home", ROOT, depth=2, limit=2, cursor=None)
    assert [e.path for e in page.entries] == ["/home/a", "/home/a/b"]
    assert page.next_cursor is not None and decode_cursor(page.next_cursor, depth=2) == b"a/b"
    assert decode_cursor(encode_cursor(b"\xff/x"), depth=2) == b"\xff/x"  # any name's bytes
    for bad in ("..", "!!", encode_cursor(b"../x"), encode_cursor(b"a/b/c")):
        with pytest.raises(ValueError):
            decode_cursor(bad, depth=2)


async def test_a_descriptor_that_is_not_one_directory_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "file"
    other.write_text("x")

    def sending(*paths: Path) -> Init:
        async def init(conn: socket.socket) -> None:
            await asyncio.get_running_loop().sock_recv(conn, 1 << 16)
            fds = [os.open(p, os.O_RDONLY) for p in paths]
            conn.sendmsg(
                [record(b"F")], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
            )
            for fd in fds:
                os.close(fd)

        return init

    before = len(os.listdir("/proc/self/fd"))
    for paths, says in (((other,), "no directory"), ((tmp_path, tmp_path), "not asked for")):
        async for files in serve(tmp_path, sending(*paths)):
            with pytest.raises(SandboxUnresponsive, match=says):
                await files.open_dir("/tmp", ROOT)
        (tmp_path / "spawn.sock").unlink()
    async for files in serve(tmp_path, sending(tmp_path)):
        fd = await files.open_dir("/tmp", ROOT)
        os.close(fd)
    assert len(os.listdir("/proc/self/fd")) == before  # every descriptor was closed


async def test_a_read_that_stalls_or_overflows_is_cut(tmp_path: Path) -> None:
    def reading(data: bytes, then: bytes, *, ends: bool = True) -> Init:
        async def init(conn: socket.socket) -> None:
            loop = asyncio.get_running_loop()
            _, ancillary, _, _ = await loop.run_in_executor(
                None, lambda: conn.recvmsg(1 << 16, socket.CMSG_SPACE(4))
            )
            (pipe,) = array.array("i", ancillary[0][2])
            await loop.sock_sendall(conn, record(b"O", struct.pack("<Q", len(data))))
            os.write(pipe, data)
            if ends:
                os.close(pipe)
            await loop.sock_sendall(conn, then)
            await asyncio.sleep(30)
            os.close(pipe)

        return init

    async for files in serve(tmp_path, reading(b"12345", record(b"D", struct.pack("<Q", 5)))):
        stream = await files.read("/tmp/x", ROOT, max_bytes=10)
        assert b"".join([c async for c in stream.chunks()]) == b"12345"
    (tmp_path / "spawn.sock").unlink()
    async for files in serve(tmp_path, reading(b"12345", record(b"D", struct.pack("<Q", 4)))):
        stream = await files.read("/tmp/x", ROOT, max_bytes=10)
        with pytest.raises(SandboxUnresponsive):  # the count does not match the bytes
            async for _ in stream.chunks():
                pass
    (tmp_path / "spawn.sock").unlink()
    async for files in serve(tmp_path, reading(b"x" * 20, b"")):
        stream = await files.read("/tmp/x", ROOT, max_bytes=10)
        with pytest.raises(FileTooLarge):
            async for _ in stream.chunks():
                pass
    (tmp_path / "spawn.sock").unlink()
    async for files in serve(tmp_path, reading(b"123", b"", ends=False)):
        stream = await files.read("/tmp/x", ROOT, max_bytes=10)
        with pytest.raises(SandboxUnresponsive, match="stalled"):
            async for _ in stream.chunks():
                pass
