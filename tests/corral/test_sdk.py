"""The Python SDK (``corral``) against a real server on a socket, fake sandbox backend.

The fake backend's commands are ``echo``, ``cat``, ``env``, ``exit N`` and ``sleep S``;
anything else answers 127 on stderr (which tells what argv reached it)."""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

import corral
from corral import AsyncCorral, AsyncTerminal, Corral
from tests.conftest import free_port
from tests.corral.server import SandboxServer, start, until_stopped


@pytest.fixture
def server(live_server: Callable[..., str], tmp_path: Path) -> SandboxServer:
    return start(live_server, tmp_path)


@pytest.fixture
def client(server: SandboxServer) -> Iterator[Corral]:
    with Corral(server.url, server.key) as sdk:
        yield sdk


@pytest.fixture(autouse=True)
def _no_corral_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_URL", raising=False)
    monkeypatch.delenv("CORRAL_API_KEY", raising=False)


def test_a_sandbox_from_creation_to_kill(client: Corral) -> None:
    sbx = client.sandboxes.create(
        "python", backend="fake", memory_mb=128, env={"GREETING": "hi"}, metadata={"ep": "7"}
    )
    assert sbx.id.startswith("sbx") and sbx.state == "running"
    assert sbx.info.memory_mb == 128 and sbx.info.metadata == {"ep": "7"}
    assert sbx.info.image_digest and sbx.info.image_digest.startswith("sha256:")
    assert sbx.info.created_at is not None and sbx.info.timings.start_ms is not None

    ran = sbx.exec(["env"], env={"EXTRA": "1"})
    assert ran.ok and "GREETING=hi\n" in ran.stdout and "EXTRA=1\n" in ran.stdout
    failed = sbx.exec(["exit", "3"])
    assert failed.exit_code == 3 and not failed.ok
    shell = sbx.exec("echo a | wc -l")  # a string goes through /bin/sh -c
    assert shell.exit_code == 127 and shell.stderr == "/bin/sh: command not found\n"
    slow = sbx.exec(["sleep", "5"], timeout_s=0.2)
    assert slow.timed_out and slow.exit_code is None and slow.signal == 9

    expires = sbx.info.expires_at
    sbx.set_timeout(600)  # within the default lifetime quota (3600 s from creation)
    assert expires is not None and sbx.info.expires_at is not None
    assert sbx.info.expires_at > expires
    assert [s.id for s in client.sandboxes.list()] == [sbx.id]
    again = client.sandboxes.get(sbx.id)
    assert again.id == sbx.id and again.info.memory_bytes == 1 << 20

    sbx.kill()  # acknowledged at once, torn down right after
    assert sbx.state == "stopping" and sbx.info.reason == "destroyed"
    assert sbx.info.ended_at is not None
    assert until_stopped(sbx) == "stopped"
    sbx.kill()  # a stopped sandbox: nothing to do
    assert client.sandboxes.list() == []
    assert [s.id for s in client.sandboxes.list("stopped")] == [sbx.id]


def test_files(client: Corral) -> None:
    with client.sandboxes.create(backend="fake") as sbx:
        entry = sbx.files.write("/home/user/notes/a.txt", "héllo")
        assert entry.path == "/home/user/notes/a.txt" and entry.size == len("héllo".encode())
        assert sbx.files.read("/home/user/notes/a.txt") == "héllo".encode()
        assert sbx.files.read_text("/home/user/notes/a.txt") == "héllo"
        sbx.files.write("/home/user/b.bin", b"\x00\xff")
        assert sbx.exec(["cat", "/home/user/b.bin"]).stdout == "\x00\ufffd"

        listed = sbx.files.list("/home/user")
        assert [(e.name, e.type) for e in listed] == [("b.bin", "file"), ("notes", "dir")]
        assert listed[1].is_dir and not listed[0].is_dir
        assert sbx.files.stat("/home/user/b.bin").size == 2
        assert sbx.files.mkdir("/work").is_dir
        moved = sbx.files.move("/home/user/b.bin", "/work/b.bin")
        assert moved.path == "/work/b.bin"
        assert sbx.files.exists("/work/b.bin") and not sbx.files.exists("/home/user/b.bin")
        sbx.files.remove("/home/user/notes")
        assert [e.name for e in sbx.files.list("/home/user")] == []
        with pytest.raises(ValueError, match="permission bits"):
            sbx.files.write("/x", b"", mode=0o17777)
    assert sbx.state == "stopping"  # the block's end destroyed it


def test_files_stream_from_a_file_object_or_chunks_and_into_a_file(
    client: Corral, tmp_path: Path
) -> None:
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(3 << 20) + b"\n" * 5)  # over the upload chunk (1 MiB)
    with client.sandboxes.create(backend="fake") as sbx:
        with source.open("rb") as opened:
            assert sbx.files.write("/home/user/big.bin", opened).size == source.stat().st_size
        target = tmp_path / "back.bin"
        with target.open("wb") as out:
            assert sbx.files.read_into("/home/user/big.bin", out) == source.stat().st_size
        assert target.read_bytes() == source.read_bytes()
        sbx.files.write("/home/user/parts", (part for part in [b"one ", bytearray(b"two")]))
        assert sbx.files.read("/home/user/parts") == b"one two"


async def test_the_async_client_streams_files(server: SandboxServer, tmp_path: Path) -> None:
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom((1 << 20) + 7))

    async def parts() -> AsyncIterator[bytes]:
        yield b"a"
        yield b"b"

    async with AsyncCorral(server.url, server.key) as sdk:
        sbx = await sdk.sandboxes.create(backend="fake")
        try:
            with source.open("rb") as opened:
                await sbx.files.write("/home/user/big.bin", opened)
            out = io.BytesIO()
            assert await sbx.files.read_into("/home/user/big.bin", out) == (1 << 20) + 7
            assert out.getvalue() == source.read_bytes()
            await sbx.files.write("/home/user/ab", parts())
            assert await sbx.files.read("/home/user/ab") == b"ab"
        finally:
            await sbx.kill()


def test_exec_gives_the_exact_bytes_of_output_that_is_not_text(client: Corral) -> None:
    sbx = client.sandboxes.create("python", backend="fake")
    noise = b"\xff\xfe\x00" + os.urandom(4096)
    sbx.files.write("/home/user/noise", noise)
    whole = sbx.exec(["cat", "noise"])
    assert whole.stdout_bytes == noise and whole.stdout == noise.decode(errors="replace")
    seen: list[str] = []
    streamed = sbx.exec(["cat", "noise"], on_stdout=seen.append)
    assert streamed.stdout_bytes == noise and "".join(seen) == streamed.stdout
    text = sbx.exec(["echo", "café"])
    assert text.stdout == "café\n" and text.stdout_bytes == "café\n".encode()


def test_a_listing_in_pages_is_gathered_by_the_sdk(
    client: Corral, monkeypatch: pytest.MonkeyPatch
) -> None:
    from node.sandboxes import http

    monkeypatch.setattr(http, "MAX_PAGE", 2)  # the node (in this process) pages by two
    with client.sandboxes.create(backend="fake") as sbx:
        for name in ("c", "a", "bb", "d", "e"):
            sbx.files.write(f"/home/user/{name}", name)
        assert [e.name for e in sbx.files.list("/home/user")] == ["a", "bb", "c", "d", "e"]
        one = f"/v1/sandboxes/{sbx.id}/files/list"
        page = client._json("GET", one, params={"path": "/home/user"})
        assert len(page["entries"]) == 2 and page["next_cursor"]


def test_streaming_calls_back_with_each_chunk(client: Corral) -> None:
    with client.sandboxes.create(backend="fake") as sbx:
        sbx.files.write("/home/user/a", "one\ntwo\n")
        seen: list[tuple[str, str]] = []
        result = sbx.exec(
            ["cat", "/home/user/a"],
            on_stdout=lambda data: seen.append(("out", data)),
            on_stderr=lambda data: seen.append(("err", data)),
        )
        assert seen == [("out", "one\ntwo\n")]
        assert result.ok and result.stdout == "one\ntwo\n" and result.pid is not None
        errors: list[str] = []
        missing = sbx.exec(["cat", "/nope"], on_stderr=errors.append)
        assert errors == ["cat: /nope: No such file\n"] and missing.exit_code == 1
        assert missing.stderr == errors[0] and missing.stdout == ""
        slow = sbx.exec(["sleep", "5"], timeout_s=0.2, on_stdout=errors.append)
        assert slow.timed_out and slow.exit_code is None


def test_errors_map_to_the_api_codes(server: SandboxServer, client: Corral) -> None:
    with pytest.raises(corral.NotFound) as nf:
        client.sandboxes.get("sbx_nope")
    assert (nf.value.code, nf.value.status) == ("not_found", 404)
    assert str(nf.value).startswith("404 not_found: ")
    with pytest.raises(corral.ImageNotFound) as no_image:
        client.sandboxes.create("nope", backend="fake")
    assert no_image.value.code == "image_not_found"
    with pytest.raises(corral.ValidationFailed) as invalid:
        client.sandboxes.create(backend="fake", memory_mb=1)
    assert (invalid.value.code, invalid.value.status) == ("validation_error", 422)
    with pytest.raises(corral.ValidationFailed) as none:
        client.sandboxes.create(backend="firecracker")
    assert (none.value.code, none.value.status) == ("backend_not_offered", 422)

    sbx = client.sandboxes.create(backend="fake")
    with pytest.raises(corral.PathNotFound) as no_path:
        sbx.files.read("/nope")
    assert isinstance(no_path.value, corral.NotFound) and no_path.value.code == "path_not_found"
    with pytest.raises(corral.InvalidPath) as root:
        sbx.files.remove("/")
    assert isinstance(root.value, corral.BadRequest) and root.value.status == 400
    sbx.pause()
    assert sbx.state == "paused"
    with pytest.raises(corral.SandboxNotRunning) as paused:
        sbx.exec(["echo"])
    assert isinstance(paused.value, corral.Conflict)
    assert (paused.value.code, paused.value.status) == ("sandbox_not_running", 409)
    with pytest.raises(corral.SandboxNotRunning):
        sbx.exec(["echo"], on_stdout=print)  # the streamed form too
    sbx.resume()
    assert sbx.exec(["echo", "back"]).stdout == "back\n"

    with Corral(server.url, server.tenant("tiny", max_concurrent_sandboxes=1)) as tiny:
        tiny.sandboxes.create(backend="fake")
        with pytest.raises(corral.ConcurrencyLimited) as full:
            tiny.sandboxes.create(backend="fake")
    assert isinstance(full.value, corral.QuotaExceeded) and full.value.status == 429
    assert full.value.retry_after is not None

    with Corral(server.url, "crl_key_wrong") as wrong, pytest.raises(corral.Unauthenticated) as bad:
        wrong.sandboxes.list()
    assert (bad.value.code, bad.value.status) == ("invalid_api_key", 401)


def test_no_server_is_a_connection_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with Corral(url, "k") as sdk, pytest.raises(corral.CorralConnectionError) as down:
        sdk.sandboxes.list()
    assert down.value.status is None and down.value.code == "connection_error"
    assert url in down.value.message and isinstance(down.value, corral.CorralError)


def test_url_and_key_come_from_the_environment_when_the_client_is_made(
    server: SandboxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_URL", server.url + "/")
    monkeypatch.setenv("CORRAL_API_KEY", server.key)
    with Corral() as sdk:
        assert sdk.url == server.url
        assert sdk.sandboxes.list() == []
    monkeypatch.setenv("CORRAL_API_KEY", "crl_key_wrong")
    with Corral(api_key=server.key) as given:  # an argument wins
        assert given.sandboxes.list() == []


async def test_the_async_client(server: SandboxServer) -> None:
    async with AsyncCorral(server.url, server.key) as sdk:
        sbx = await sdk.sandboxes.create(backend="fake", env={"A": "1"})
        async with sbx:
            assert "A=1\n" in (await sbx.exec(["env"])).stdout
            await sbx.files.write("/home/user/x", "x-data\n")
            assert await sbx.files.read_text("/home/user/x") == "x-data\n"
            assert [e.name for e in await sbx.files.list("/home/user")] == ["x"]
            assert (await sbx.files.stat("/home/user/x")).size == 7

            chunks: list[str] = []

            async def collect(data: str) -> None:
                await asyncio.sleep(0)
                chunks.append(data)

            streamed = await sbx.exec(["cat", "/home/user/x"], on_stdout=collect)
            assert chunks == ["x-data\n"] and streamed.stdout == "x-data\n"
            plain: list[str] = []
            await sbx.exec(["echo", "b"], on_stdout=plain.append)  # a plain callable too
            assert plain == ["b\n"]

            await sbx.pause()
            with pytest.raises(corral.SandboxNotRunning):
                await sbx.exec(["echo"], on_stdout=plain.append)
            await sbx.resume()
            listed = await sdk.sandboxes.list()
            assert [s.id for s in listed] == [sbx.id]
            assert (await sdk.sandboxes.get(sbx.id)).state == "running"
        assert sbx.state == "stopping"  # destroyed: acknowledged
        with pytest.raises(corral.NotFound):
            await sdk.sandboxes.get("sbx_nope")


async def _until(terminal: AsyncTerminal, text: bytes) -> None:
    seen = b""
    while text not in seen:
        frame = await terminal.recv()
        assert frame is not None, f"ended ({terminal.ended}) before {text!r}: {seen!r}"
        seen += frame


async def test_the_async_client_opens_a_terminal(server: SandboxServer) -> None:
    async with AsyncCorral(server.url, server.key) as sdk:
        sbx = await sdk.sandboxes.create(backend="fake")
        async with sbx, sbx.terminal(cols=80, rows=24) as terminal:
            await terminal.send("stty size\r")
            await _until(terminal, b"24 80\r\n")
            await terminal.resize(100, 30)
            await terminal.send(b"stty size\r")
            await _until(terminal, b"30 100\r\n")
            await terminal.send("exit 4\r")
            while await terminal.recv() is not None:
                pass
            assert (terminal.close_code, terminal.ended) == (1000, "exit 4")
