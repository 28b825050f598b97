"""A sandbox's terminal over the API's WebSocket (``GET /v1/sandboxes/{id}/terminal``)
on a real server and a real crun sandbox: a shell that takes input, resizes and says how
it ended in the close; only with the tenant's key, on its own sandboxes; input bounded;
the shell goes with its client, and the connection with its sandbox."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from app.sandboxes.terminal import MAX_INPUT_BYTES
from tests.app.api.v1.test_sandboxes import add_busybox
from tests.conftest import ADMIN

pytestmark = [pytest.mark.crun]


@dataclass
class Live:
    url: str
    key: str
    sandbox_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def terminal(self, key: str | None = None, query: str = "") -> Any:
        ws = self.url.replace("http://", "ws://")
        headers = {"Authorization": f"Bearer {key or self.key}"}
        return connect(
            f"{ws}/v1/sandboxes/{self.sandbox_id}/terminal{query}", additional_headers=headers
        )


def tenant(url: str, name: str) -> str:
    made = httpx.post(f"{url}/v1/tenants", json={"name": name}, headers=ADMIN)
    assert made.status_code == 201, made.text
    return str(made.json()["key"]["api_key"])


@pytest.fixture
def live(live_server: Callable[..., str], tmp_path: Path) -> Iterator[Live]:
    images = tmp_path / "images"
    add_busybox(images)
    url = live_server(sandbox_backends=["crun"], images_dir=images)
    key = tenant(url, "terminals")
    headers = {"Authorization": f"Bearer {key}"}
    made = httpx.post(
        f"{url}/v1/sandboxes",
        json={"image": "busybox", "backend": "crun"},
        headers=headers,
        timeout=60,
    )
    assert made.status_code == 201, made.text
    yield Live(url, key, made.json()["id"])
    httpx.delete(f"{url}/v1/sandboxes/{made.json()['id']}", headers=headers, timeout=60)


async def until(ws: ClientConnection, text: bytes) -> bytes:
    """What the terminal wrote, once ``text`` is in it."""
    seen = b""
    async with asyncio.timeout(20):
        while text not in seen:
            frame = await ws.recv()
            assert isinstance(frame, bytes)
            seen += frame
    return seen


async def closed(ws: ClientConnection) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as ended:
        async with asyncio.timeout(20):
            while True:
                await ws.recv()
    assert ended.value.rcvd is not None
    return ended.value.rcvd.code, ended.value.rcvd.reason


async def test_a_terminal_runs_a_shell_resizes_and_closes_with_its_exit(live: Live) -> None:
    async with live.terminal(query="?cols=90&rows=30") as ws:
        await ws.send(b"tty; stty size; echo $((6*7))\n")
        seen = await until(ws, b"42\r\n")
        assert b"/dev/pts/" in seen and b"30 90\r\n" in seen
        await ws.send(json.dumps({"type": "resize", "cols": 120, "rows": 40}))
        await ws.send(b"stty size\n")
        await until(ws, b"40 120\r\n")
        await ws.send(b"exit 5\n")
        assert await closed(ws) == (1000, "exit 5")


async def test_a_terminal_needs_the_tenants_key_and_its_own_sandbox(live: Live) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with live.terminal(key="crl_key_not_a_key"):
            pass
    assert refused.value.response.status_code == 403
    other = tenant(live.url, "someone-else")
    async with live.terminal(key=other) as ws:
        code, reason = await closed(ws)
    assert code == 4404 and live.sandbox_id in reason


async def test_input_is_bounded_and_a_text_frame_must_be_a_resize(live: Live) -> None:
    async with live.terminal() as ws:
        await ws.send(b"x" * (MAX_INPUT_BYTES + 1))
        assert (await closed(ws))[0] == 1009
    async with live.terminal() as ws:
        await ws.send("hello")
        assert (await closed(ws))[0] == 1003


async def processes(live: Live) -> str:
    async with httpx.AsyncClient(timeout=30) as client:
        ran = await client.post(
            f"{live.url}/v1/sandboxes/{live.sandbox_id}/exec",
            json={"cmd": ["ps", "-o", "args"]},
            headers=live.headers,
        )
    assert ran.status_code == 200, ran.text
    return str(ran.json()["stdout"])


async def test_the_shell_goes_with_its_client(live: Live) -> None:
    async with live.terminal() as ws:
        # the shell's fork runs `sleep` a moment after `echo` may print: wait for it
        await ws.send(
            b"sleep 1234 & while ! ps -o args | grep -q '^sleep 1234'; do :; done; "
            b'echo st""arted\n'  # not the terminal's echo of this line: the shell's output
        )
        await until(ws, b"started")
        assert "sleep 1234" in await processes(live)
    for _ in range(200):  # its session's kill is asynchronous
        if "sleep 1234" not in await processes(live):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the shell's session outlived its client")


async def test_the_connection_closes_when_the_sandbox_stops(live: Live) -> None:
    async with live.terminal() as ws:
        await ws.send(b'echo re""ady\n')
        await until(ws, b"ready")
        async with httpx.AsyncClient(timeout=30) as client:
            stopped = await client.delete(
                f"{live.url}/v1/sandboxes/{live.sandbox_id}", headers=live.headers
            )
        assert stopped.status_code in (200, 202), stopped.text
        code, reason = await closed(ws)
    assert code in (1000, 1001) and (code == 1001 or reason.startswith("signal"))
