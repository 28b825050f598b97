"""A sandbox's terminal: ``AsyncSandbox.terminal()`` over the API's WebSocket
(``GET /v1/sandboxes/{id}/terminal``: a login shell on a terminal of the sandbox's own).

``send`` types (bytes, or text as UTF-8), ``resize`` changes the size, ``recv`` gives the
terminal's output as it comes and None once the shell has ended; ``ended`` then says how
(``"exit 0"``, ``"signal 9"``, or the error that closed it). Leaving the ``async with``
block (or ``close()``) ends the shell.

The WebSocket client is ``websockets`` (``pip install 'corral[terminal]'``), imported only
when a terminal opens: the rest of the SDK needs nothing but httpx.
"""

from __future__ import annotations

import json
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection


class AsyncTerminal:
    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self._url = url
        self._headers = headers
        self._ws: ClientConnection | None = None
        self.ended: str | None = None  #: how the shell ended (the close's reason)
        self.close_code: int | None = None

    async def __aenter__(self) -> AsyncTerminal:
        try:
            from websockets.asyncio.client import connect
        except ImportError as missing:
            raise RuntimeError(
                "a terminal needs the websockets package: pip install 'corral[terminal]'"
            ) from missing
        self._ws = await connect(self._url, additional_headers=self._headers)
        return self

    async def __aexit__(
        self, *exc: type[BaseException] | BaseException | TracebackType | None
    ) -> None:
        await self.close()

    def _open(self) -> ClientConnection:
        if self._ws is None:
            raise RuntimeError("use the terminal in 'async with'")
        return self._ws

    async def send(self, data: bytes | str) -> None:
        await self._open().send(data.encode() if isinstance(data, str) else data)

    async def resize(self, cols: int, rows: int) -> None:
        await self._open().send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    async def recv(self) -> bytes | None:
        """The next output, or None once the shell has ended (``ended`` says how)."""
        from websockets.exceptions import ConnectionClosed

        try:
            frame: Any = await self._open().recv()
        except ConnectionClosed as closed:
            if closed.rcvd is not None:
                self.close_code, self.ended = closed.rcvd.code, closed.rcvd.reason
            return None
        return frame if isinstance(frame, bytes) else frame.encode()

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
