"""A small asyncio QMP client (QEMU's JSON machine protocol over a Unix socket).

``await Qmp.connect(path)`` reads the greeting and negotiates capabilities; ``execute``
sends one command and returns its ``return`` (a QMP ``error`` raises ``QmpError``);
events are kept in a bounded queue (``events``, ``wait_event``). Reads are bounded: a line
longer than ``MAX_LINE`` ends the connection. ``execute(..., fds=[fd])`` passes
descriptors with the command (SCM_RIGHTS), as ``getfd`` needs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import socket
import time
from collections.abc import Sequence
from typing import Any

from node.sandboxes.base import SandboxError

MAX_LINE = 1 << 20
MAX_EVENTS = 256


class QmpError(SandboxError):
    """QEMU refused a command, or its monitor connection failed."""

    status, code = 503, "sandbox_unresponsive"


class Qmp:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()
        self._next_id = 0
        self._lock = asyncio.Lock()
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_EVENTS)
        self.closed = False

    @classmethod
    async def connect(cls, path: str, timeout: float = 10.0) -> Qmp:
        """Connect to ``path`` (retrying while QEMU has not made it yet, up to
        ``timeout``) and negotiate capabilities."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                if time.monotonic() > deadline:
                    raise QmpError(f"no QMP socket at {path}") from None
                await asyncio.sleep(0.005)
            except BaseException:
                sock.close()
                raise
        qmp = cls(sock)
        try:
            async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                greeting = await qmp._read()
                if "QMP" not in greeting:
                    raise QmpError(f"not a QMP greeting: {greeting!r:.200}")
                await qmp.execute("qmp_capabilities")
        except TimeoutError:
            qmp.close()
            raise QmpError(f"QMP at {path} did not answer") from None
        except BaseException:
            qmp.close()
            raise
        return qmp

    async def _read(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                if not line.strip():
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    self.close()
                    raise QmpError("QMP sent a line that is not JSON") from None
                if not isinstance(msg, dict):
                    self.close()
                    raise QmpError("QMP sent a message that is not an object")
                return msg
            if len(self._buf) > MAX_LINE:
                self.close()
                raise QmpError("QMP line too long")
            try:
                chunk = await loop.sock_recv(self._sock, 65536)
            except OSError as e:
                self.close()
                raise QmpError(f"QMP connection failed: {e}") from e
            if not chunk:
                self.close()
                raise QmpError("QMP connection closed")
            self._buf += chunk

    async def _send(self, data: bytes, fds: list[int]) -> None:
        loop = asyncio.get_running_loop()
        try:
            if fds:
                # a short message with its descriptors; the socket is writable (nothing
                # is queued on it)
                sent = socket.send_fds(self._sock, [data], list(fds))
                data = data[sent:]
            if data:
                await loop.sock_sendall(self._sock, data)
        except OSError as e:
            self.close()
            raise QmpError(f"QMP connection failed: {e}") from e

    async def execute(
        self, command: str, arguments: dict[str, Any] | None = None, *, fds: Sequence[int] = ()
    ) -> Any:
        """Run ``command``; its ``return`` value. Events read meanwhile are queued."""
        if self.closed:
            raise QmpError("QMP connection closed")
        async with self._lock:
            self._next_id += 1
            ident = f"c{self._next_id}"
            msg: dict[str, Any] = {"execute": command, "id": ident}
            if arguments:
                msg["arguments"] = arguments
            await self._send(json.dumps(msg).encode() + b"\n", list(fds))
            while True:
                reply = await self._read()
                if "event" in reply:
                    self.events.append(reply)
                    continue
                if reply.get("id") != ident:
                    continue
                if "error" in reply:
                    err = reply["error"]
                    desc = err.get("desc") if isinstance(err, dict) else err
                    raise QmpError(f"QMP {command}: {desc}")
                return reply.get("return")

    async def wait_event(self, name: str, timeout: float) -> dict[str, Any]:
        """The first queued or next event called ``name`` (removed from the queue)."""
        async with asyncio.timeout(timeout), self._lock:
            while True:
                for event in list(self.events):
                    if event.get("event") == name:
                        self.events.remove(event)
                        return event
                msg = await self._read()
                if "event" in msg:
                    self.events.append(msg)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self._sock.close()
