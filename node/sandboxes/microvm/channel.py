"""The host side of the microVM guest agent's protocol (the full protocol: below, soon)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from node.sandboxes.microvm.frames import (
    GUEST_CTL,
    GUEST_DATA,
    HOST_DATA,
    MAX_PAYLOAD,
    RAW,
    WINDOW,
    Frame,
    FrameError,
    FrameType,
    decode_fields,
    encode,
    encode_fields,
    read_frame,
)

log = logging.getLogger(__name__)

T = FrameType
#: the most control replies one stream may have waiting for its consumer
MAX_QUEUED = 8192
#: the most entries one LIST may answer (the agent's own bound)
MAX_LIST = 65536
#: the most credit the guest may have granted and the host not used
MAX_SEND_CREDIT = 1 << 41
ENTRY_TYPES = frozenset({"file", "dir", "symlink", "other"})

ProcessEvent = tuple[Literal["stdout", "stderr"], bytes] | tuple[Literal["exit"], int]
Entry = dict[str, str]


class AgentError(Exception):
    """The agent answered ERROR: ``code`` as in node/sandboxes/base.py."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class AgentGone(Exception):
    """The connection to the agent is lost, closed, or was corrupt (or a ping timed out)."""


class _ProtocolError(Exception):
    pass


@dataclass(eq=False)
class _Stream:
    id: int
    ctl_types: frozenset[int]
    data_types: frozenset[int] = frozenset()
    replies: deque[Frame] = field(default_factory=deque)
    data: deque[Frame] = field(default_factory=deque)
    event: asyncio.Event = field(default_factory=asyncio.Event)
    #: data bytes the guest may still send before our CREDIT (ours to grant)
    allowance: int = WINDOW
    #: data bytes received and not yet taken by the consumer
    buffered: int = 0
    #: data bytes we may still send the guest
    send_credit: int = WINDOW
    #: EXIT / FILE_END received
    ended: bool = False
    #: an exec that has started: later ERROR / STARTED replies are dropped
    started: bool = False


def _number(text: str | None, limit: int) -> int:
    if text is None or not text.isdigit() or not text.isascii() or len(text) > 20:
        raise _ProtocolError(f"not a number: {text!r}")
    value = int(text)
    if value > limit:
        raise _ProtocolError(f"number out of range: {value}")
    return value


def _entry(payload: bytes) -> Entry:
    fields = dict(decode_fields(payload))
    if not fields.get("name") or not fields.get("path", "").startswith("/"):
        raise _ProtocolError("an entry without name or absolute path")
    if fields.get("type") not in ENTRY_TYPES:
        raise _ProtocolError(f"an entry of unknown type {fields.get('type')!r}")
    return fields


def _error(frame: Frame) -> AgentError:
    fields = dict(decode_fields(frame.payload))
    return AgentError(fields.get("code", "internal"), fields.get("message", ""))


class AgentChannel:
    """The host's end of the two ports of one guest agent (see the module docstring)."""

    def __init__(
        self,
        ctl: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        data: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        *,
        name: str = "microvm",
    ) -> None:
        self.name = name
        self._ctl_writer = ctl[1]
        self._data_writer = data[1]
        self._streams: dict[int, _Stream] = {}
        self._next_id = 1
        self._closed = False
        self._reason = ""
        self._hello_lock = asyncio.Lock()
        self._readers = [
            asyncio.create_task(self._read(ctl[0], is_ctl=True), name=f"{name}-agent-ctl"),
            asyncio.create_task(self._read(data[0], is_ctl=False), name=f"{name}-agent-data"),
        ]

    @classmethod
    async def connect(
        cls, ctl_path: str, data_path: str, *, timeout: float, name: str = "microvm"
    ) -> AgentChannel:
        """Connects to the Unix sockets QEMU serves the two ports on."""
        opened: list[asyncio.StreamWriter] = []
        try:
            async with asyncio.timeout(timeout):
                ctl = await asyncio.open_unix_connection(ctl_path, limit=2 * MAX_PAYLOAD)
                opened.append(ctl[1])
                data = await asyncio.open_unix_connection(data_path, limit=2 * MAX_PAYLOAD)
                opened.append(data[1])
        except (OSError, TimeoutError) as e:
            for writer in opened:
                writer.close()
            raise AgentGone(f"{name}: cannot connect to the agent: {e!r}") from e
        return cls(ctl, data, name=name)

    @classmethod
    async def from_sockets(
        cls, ctl: socket.socket, data: socket.socket, *, name: str = "microvm"
    ) -> AgentChannel:
        """Over two connected sockets (the channel owns them from now on)."""
        ctl_pair = await asyncio.open_unix_connection(sock=ctl, limit=2 * MAX_PAYLOAD)
        data_pair = await asyncio.open_unix_connection(sock=data, limit=2 * MAX_PAYLOAD)
        return cls(ctl_pair, data_pair, name=name)

    # ---- the connection -----------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        self._fail("closed by the host", log_it=False)
        for task in self._readers:
            task.cancel()
        for task in self._readers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for writer in (self._ctl_writer, self._data_writer):
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    def _fail(self, reason: str, *, log_it: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        self._reason = reason
        if log_it:
            log.warning("%s: the agent's connection ends: %s", self.name, reason)
        for writer in (self._ctl_writer, self._data_writer):
            writer.close()
        current = asyncio.current_task()
        for task in self._readers:
            if task is not current:
                task.cancel()
        for stream in self._streams.values():
            stream.event.set()

    def _gone(self) -> AgentGone:
        return AgentGone(f"{self.name}: {self._reason}")

    async def _read(self, reader: asyncio.StreamReader, *, is_ctl: bool) -> None:
        port = "ctl" if is_ctl else "data"
        try:
            while True:
                frame = await read_frame(reader)
                if frame is None:
                    raise _ProtocolError(f"the {port} port closed")
                self._dispatch(frame, is_ctl=is_ctl)
        except (FrameError, _ProtocolError) as e:
            self._fail(f"{port} port: {e}")
        except (OSError, EOFError) as e:
            self._fail(f"{port} port: {e!r}")

    def _dispatch(self, frame: Frame, *, is_ctl: bool) -> None:
        allowed = GUEST_CTL if is_ctl else GUEST_DATA
        if frame.type not in allowed:
            raise _ProtocolError(f"type {frame.type} on stream {frame.stream} not allowed here")
        if frame.type not in RAW:
            decode_fields(frame.payload)  # well formed, or FrameError
        stream = self._streams.get(frame.stream)
        if stream is None:
            if 0 < frame.stream < self._next_id:
                return  # a stream the host is done with: a frame still in flight
            raise _ProtocolError(f"unknown stream {frame.stream}")
        if frame.type == T.CREDIT:
            credit = _number(dict(decode_fields(frame.payload)).get("bytes"), MAX_SEND_CREDIT)
            stream.send_credit += credit
            if stream.send_credit > MAX_SEND_CREDIT:
                raise _ProtocolError("credit beyond any bound")
        elif is_ctl:
            if frame.type not in stream.ctl_types:
                raise _ProtocolError(f"type {frame.type} on stream {frame.stream} unexpected")
            if frame.type in (T.ENTRY, T.FILE_INFO):
                _entry(frame.payload)
            if stream.started:
                log.debug("%s: stream %d: reply %d dropped", self.name, stream.id, frame.type)
                return
            if len(stream.replies) >= MAX_QUEUED:
                raise _ProtocolError(f"stream {frame.stream}: too many replies")
            stream.replies.append(frame)
        else:
            if frame.type not in stream.data_types or stream.ended:
                raise _ProtocolError(f"type {frame.type} on stream {frame.stream} unexpected")
            if frame.type in RAW:
                if len(frame.payload) > stream.allowance:
                    raise _ProtocolError(f"stream {frame.stream} sent beyond its window")
                stream.allowance -= len(frame.payload)
                stream.buffered += len(frame.payload)
            else:
                stream.ended = True
                if frame.type == T.EXIT:
                    _number(dict(decode_fields(frame.payload)).get("status"), 0xFFFF)
            stream.data.append(frame)
        stream.event.set()

    # ---- streams ------------------------------------------------------------------

    def _open(self, ctl_types: frozenset[int], data_types: frozenset[int] = frozenset()) -> _Stream:
        if self._closed:
            raise self._gone()
        stream = _Stream(self._next_id, ctl_types | {T.ERROR}, data_types)
        self._next_id += 1
        self._streams[stream.id] = stream
        return stream

    def _forget(self, stream: _Stream, *, release: bool) -> None:
        if self._streams.pop(stream.id, None) is None:
            return
        if release and not self._closed:
            self._ctl_writer.write(encode(stream.id, T.RELEASE))

    async def _wait(self, stream: _Stream) -> None:
        if self._closed:
            raise self._gone()
        stream.event.clear()
        await stream.event.wait()

    async def _reply(self, stream: _Stream) -> Frame:
        while not stream.replies:
            await self._wait(stream)
        return stream.replies.popleft()

    async def _send(self, stream_id: int, type_: int, payload: bytes = b"") -> None:
        if self._closed:
            raise self._gone()
        writer = self._data_writer if type_ in HOST_DATA else self._ctl_writer
        writer.write(encode(stream_id, type_, payload))
        try:
            await writer.drain()
        except (OSError, RuntimeError) as e:
            self._fail(f"cannot send: {e!r}")
            raise self._gone() from e

    async def _grant(self, stream: _Stream, n: int) -> None:
        """The consumer took ``n`` bytes: the guest may send as many more."""
        stream.buffered -= n
        if self._closed or stream.id not in self._streams or n == 0:
            return
        stream.allowance += n
        await self._send(stream.id, T.CREDIT, encode_fields({"bytes": str(n)}))

    async def _request(self, stream: _Stream, type_: int, fields: list[tuple[str, str]]) -> Frame:
        """Sends a request and returns its first reply (ERROR: raised)."""
        await self._send(stream.id, type_, encode_fields(fields))
        reply = await self._reply(stream)
        if reply.type == T.ERROR:
            raise _error(reply)
        return reply

    # ---- requests -----------------------------------------------------------------

    async def hello(self, *, time_ns: int, entropy: bytes, hostname: str, machine_id: str) -> None:
        fields = {
            "time_ns": str(time_ns),
            "entropy": entropy.hex(),
            "hostname": hostname,
            "machine_id": machine_id,
        }
        async with self._hello_lock:
            if self._closed:
                raise self._gone()
            stream = _Stream(0, frozenset({T.HELLO_OK}))
            self._streams[0] = stream
            try:
                await self._send(0, T.HELLO, encode_fields(fields))
                await self._reply(stream)
            finally:
                self._streams.pop(0, None)

    async def ping(self, timeout: float) -> float:
        """Seconds the round trip took; ``AgentGone`` when no PONG comes in ``timeout``."""
        stream = self._open(frozenset({T.PONG}))
        start = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                await self._send(stream.id, T.PING)
                await self._reply(stream)
        except TimeoutError as e:
            raise AgentGone(f"{self.name}: no answer to a ping in {timeout}s") from e
        finally:
            self._forget(stream, release=False)
        return time.monotonic() - start

    async def exec(
        self,
        *,
        argv: list[str],
        env: Mapping[str, str],
        cwd: str,
        user: str,
        stdin: bool,
        pty: tuple[int, int] | None,
    ) -> GuestProcess:
        fields = [("user", user), ("cwd", cwd), *(("arg", a) for a in argv)]
        fields += [("env", f"{k}={v}") for k, v in env.items()]
        if stdin:
            fields.append(("stdin", "1"))
        if pty is not None:
            fields.append(("pty", f"{pty[0]}x{pty[1]}"))
        stream = self._open(frozenset({T.STARTED}), frozenset({T.STDOUT, T.STDERR, T.EXIT}))
        try:
            started = await self._request(stream, T.EXEC, fields)
            pid = _number(dict(decode_fields(started.payload)).get("pid"), 1 << 31)
        except _ProtocolError as e:
            self._fail(f"stream {stream.id}: {e}")
            self._forget(stream, release=False)
            raise self._gone() from e
        except BaseException:
            self._forget(stream, release=True)
            raise
        stream.started = True
        return GuestProcess(self, stream, pid, pty=pty is not None)

    async def read_file(
        self, path: str, *, user: str, max_bytes: int
    ) -> tuple[Entry, AsyncIterator[bytes]]:
        """The file's entry and its bytes (iterate the bytes to the end, or ``aclose``
        them: the stream is released then)."""
        stream = self._open(frozenset({T.FILE_INFO}), frozenset({T.FILE_DATA, T.FILE_END}))
        fields = [("user", user), ("path", path), ("max", str(max_bytes))]
        try:
            info = await self._request(stream, T.FILE_READ, fields)
        except BaseException:
            self._forget(stream, release=True)
            raise
        return _entry(info.payload), self._file_bytes(stream, max_bytes)

    async def _file_bytes(self, stream: _Stream, max_bytes: int) -> AsyncIterator[bytes]:
        total = 0
        try:
            while True:
                while not stream.data:
                    await self._wait(stream)
                frame = stream.data.popleft()
                if frame.type == T.FILE_END:
                    fields = dict(decode_fields(frame.payload))
                    if "code" in fields:
                        raise AgentError(fields["code"], fields.get("message", ""))
                    return
                total += len(frame.payload)
                if total > max_bytes:
                    raise AgentError("file_too_large", f"more than {max_bytes} bytes")
                await self._grant(stream, len(frame.payload))
                yield frame.payload
        finally:
            self._forget(stream, release=True)

    async def write_file(
        self, path: str, chunks: AsyncIterable[bytes], *, user: str, mode: int
    ) -> Entry:
        stream = self._open(frozenset({T.ENTRY}))
        stream.send_credit = 0  # the guest's first CREDIT says the file is open
        fields = [("user", user), ("path", path), ("mode", f"{mode:o}")]
        try:
            await self._send(stream.id, T.FILE_WRITE, encode_fields(fields))
            await self._await_credit(stream)
            async for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    await self._await_credit(stream)
                    n = min(len(view), stream.send_credit, MAX_PAYLOAD)
                    stream.send_credit -= n
                    await self._send(stream.id, T.FILE_DATA, bytes(view[:n]))
                    view = view[n:]
            await self._send(stream.id, T.FILE_END)
            reply = await self._reply(stream)
            if reply.type == T.ERROR:
                raise _error(reply)
            return _entry(reply.payload)
        finally:
            self._forget(stream, release=True)

    async def _await_credit(self, stream: _Stream) -> None:
        while stream.send_credit == 0 and not stream.replies:
            await self._wait(stream)
        if stream.replies:
            reply = stream.replies.popleft()
            if reply.type == T.ERROR:
                raise _error(reply)
            self._fail(f"stream {stream.id}: an entry before the file's end")
            raise self._gone()

    async def _entry_request(self, type_: int, fields: list[tuple[str, str]]) -> Entry:
        stream = self._open(frozenset({T.ENTRY}))
        try:
            return _entry((await self._request(stream, type_, fields)).payload)
        finally:
            self._forget(stream, release=False)

    async def stat(self, path: str, *, user: str) -> Entry:
        return await self._entry_request(T.STAT, [("user", user), ("path", path)])

    async def make_dir(self, path: str, *, user: str) -> Entry:
        return await self._entry_request(T.MKDIR, [("user", user), ("path", path)])

    async def remove(self, path: str, *, user: str) -> Entry:
        return await self._entry_request(T.REMOVE, [("user", user), ("path", path)])

    async def move(self, source: str, destination: str, *, user: str) -> Entry:
        fields = [("user", user), ("source", source), ("destination", destination)]
        return await self._entry_request(T.MOVE, fields)

    async def list_dir(self, path: str, *, user: str, depth: int) -> list[Entry]:
        stream = self._open(frozenset({T.ENTRY, T.LIST_END}))
        fields = [("user", user), ("path", path), ("depth", str(depth))]
        entries: list[Entry] = []
        try:
            reply = await self._request(stream, T.LIST, fields)
            while reply.type != T.LIST_END:
                if len(entries) >= MAX_LIST:
                    self._fail(f"stream {stream.id}: a listing beyond {MAX_LIST} entries")
                    raise self._gone()
                entries.append(_entry(reply.payload))
                reply = await self._reply(stream)
                if reply.type == T.ERROR:
                    raise _error(reply)
            return entries
        finally:
            self._forget(stream, release=True)


class GuestProcess:
    """A command started by ``AgentChannel.exec``; ``release`` it when done."""

    def __init__(self, channel: AgentChannel, stream: _Stream, pid: int, *, pty: bool) -> None:
        self._channel = channel
        self._stream = stream
        self.pid = pid
        self.pty = pty
        self._released = False

    @property
    def buffered(self) -> int:
        """Output bytes received from the guest and not yet taken from ``events``."""
        return self._stream.buffered

    async def events(self) -> AsyncIterator[ProcessEvent]:
        """("stdout" | "stderr", bytes) as they come, then one ("exit", raw wait status);
        the guest gets credit for the bytes as they are taken."""
        stream = self._stream
        while True:
            while not stream.data:
                await self._channel._wait(stream)
            frame = stream.data.popleft()
            if frame.type == T.EXIT:
                yield ("exit", int(dict(decode_fields(frame.payload))["status"]))
                return
            await self._channel._grant(stream, len(frame.payload))
            yield ("stdout" if frame.type == T.STDOUT else "stderr", frame.payload)

    async def write_stdin(self, data: bytes) -> None:
        """Sends ``data`` within the guest's credit (waits for more); bytes after the
        command ended are dropped."""
        stream = self._stream
        view = memoryview(data)
        while view:
            while stream.send_credit == 0 and not stream.ended:
                await self._channel._wait(stream)
            if stream.ended or self._released:
                return
            n = min(len(view), stream.send_credit, MAX_PAYLOAD)
            stream.send_credit -= n
            await self._channel._send(stream.id, T.STDIN, bytes(view[:n]))
            view = view[n:]

    async def close_stdin(self) -> None:
        await self._channel._send(self._stream.id, T.STDIN_CLOSE)

    async def signal(self, number: int) -> None:
        await self._channel._send(self._stream.id, T.SIGNAL, encode_fields({"signal": str(number)}))

    async def resize(self, cols: int, rows: int) -> None:
        if not self.pty:
            raise AgentError("not_a_terminal", "the command has no terminal")
        fields = {"cols": str(cols), "rows": str(rows)}
        await self._channel._send(self._stream.id, T.RESIZE, encode_fields(fields))

    async def release(self) -> None:
        """The host is done: the guest forgets the command (and kills what is left of
        its session)."""
        if not self._released:
            self._released = True
            self._channel._forget(self._stream, release=True)
