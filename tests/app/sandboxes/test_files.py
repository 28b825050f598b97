"""The gateway's half of file transfers: multipart bodies parsed as they stream in,
bounded uploads, and listings gathered up to a cap."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.requests import Request

from app.errors import BadRequest, PayloadTooLarge
from app.sandboxes import files
from app.sandboxes.files import MultipartFiles, bounded, list_capped
from wire.sandboxes import EntryPage, FileEntry, FileType

BOUNDARY = "b0undary"


def body(*parts: tuple[str, str | None, bytes]) -> bytes:
    out = b""
    for name, filename, data in parts:
        disposition = f'form-data; name="{name}"' + (
            f'; filename="{filename}"' if filename is not None else ""
        )
        out += f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        out += data + b"\r\n"
    return out + f"--{BOUNDARY}--\r\n".encode()


def request(raw: bytes, chunk: int) -> Request:
    """A request whose body arrives ``chunk`` bytes at a time."""
    pieces = [raw[at : at + chunk] for at in range(0, len(raw), chunk)] or [b""]
    sent = iter(enumerate(pieces, 1))

    async def receive() -> dict[str, Any]:
        n, piece = next(sent, (0, b""))
        if not n:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": piece, "more_body": n < len(pieces)}

    scope = {
        "type": "http",
        "method": "POST",
        "headers": [(b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode())],
    }
    return Request(scope, receive)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 16])
async def test_each_file_of_a_multipart_body_streams_as_it_arrives(chunk: int) -> None:
    big = bytes(range(256)) * 40
    raw = body(("file", "/a.txt", b"one"), ("note", None, b"a field"), ("file", "b.bin", big))
    got: list[tuple[str, str | None, bytes]] = []
    upload = MultipartFiles(request(raw, chunk))
    async for part in upload.parts():
        if part.filename == "/a.txt":
            continue  # not read: passed over
        data = b"".join([piece async for piece in upload.data()])
        got.append((part.name, part.filename, data))
    assert got == [("note", None, b"a field"), ("file", "b.bin", big)]


async def test_a_bad_multipart_body_is_a_400() -> None:
    cut = body(("file", "/a.txt", b"one"))[:-20]
    with pytest.raises(BadRequest, match="ends in the middle"):
        async for _ in MultipartFiles(request(cut, 64)).parts():
            pass
    huge_header = f"--{BOUNDARY}\r\nX-Pad: {'p' * 20000}\r\n\r\nx\r\n--{BOUNDARY}--\r\n"
    with pytest.raises(BadRequest, match="header"):
        async for _ in MultipartFiles(request(huge_header.encode(), 4096)).parts():
            pass
    no_boundary = Request(
        {"type": "http", "method": "POST", "headers": [(b"content-type", b"multipart/form-data")]}
    )
    with pytest.raises(BadRequest, match="boundary"):
        MultipartFiles(no_boundary)


async def test_a_multipart_body_has_a_bounded_number_of_parts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(files, "MAX_PARTS", 3)
    raw = body(*[("file", f"/{i}", b"x") for i in range(5)])
    with pytest.raises(BadRequest, match="at most 3 parts"):
        async for _ in MultipartFiles(request(raw, 64)).parts():
            pass


async def test_what_a_multipart_body_passes_over_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(files, "MAX_PASSED_OVER", 100)
    fits = body(("note", None, b"n" * 60), ("other", None, b"o" * 40), ("file", "/f", b"x" * 500))
    upload = MultipartFiles(request(fits, 64))
    read = [
        b"".join([p async for p in upload.data()]) async for part in upload.parts() if part.filename
    ]
    assert read == [b"x" * 500]  # a file read is not passed over
    endless = body(("note", None, b"n" * 60), ("other", None, b"o" * 41))
    with pytest.raises(PayloadTooLarge, match="fields are at most 100 bytes"):
        async for _ in MultipartFiles(request(endless, 64)).parts():
            pass


async def test_an_upload_past_the_limit_is_refused() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 100

    assert len(b"".join([c async for c in bounded(chunks(), 1000)])) == 1000
    with pytest.raises(PayloadTooLarge):
        async for _ in bounded(chunks(), 999):
            pass


class PagedNode:
    """A node's listing in pages of two."""

    def __init__(self, count: int) -> None:
        self.names = [f"f{i:03}" for i in range(count)]
        self.calls = 0

    async def list_dir(self, sandbox_id: str, path: str, **kw: Any) -> EntryPage:
        self.calls += 1
        start = int(kw["cursor"] or 0)
        names = self.names[start : start + 2]
        more = start + 2 < len(self.names)
        entries = [
            FileEntry(
                name=n,
                path=f"{path}/{n}",
                type=FileType.FILE,
                size=0,
                mode=0o644,
                owner="0",
                group="0",
                modified_at=0.0,
            )
            for n in names
        ]
        return EntryPage(entries=entries, next_cursor=str(start + 2) if more else None)


async def test_a_listing_is_gathered_page_by_page_up_to_its_cap() -> None:
    node = PagedNode(5)
    got = await list_capped(node, "sbx", "/d", depth=1, user=None, cap=5)  # type: ignore[arg-type]
    assert [e.name for e in got] == node.names and node.calls == 3
    with pytest.raises(PayloadTooLarge, match="more than 4 entries"):
        await list_capped(PagedNode(5), "sbx", "/d", depth=1, user=None, cap=4)  # type: ignore[arg-type]
