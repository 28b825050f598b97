"""The host side of the microVM guest agent: ``AgentChannel`` over its two ports.

The final protocol (the same as docs/microvm-protocol.md):

# The microVM guest agent's protocol (v1) — the contract between the host and `corral-vmagent`

The host (the node, Python, `node/sandboxes/microvm/channel.py`) talks to the guest agent
(`node/sandboxes/guest/corral-vmagent.c`, built by `scripts/setup-sandboxes.sh` into
`node/sandboxes/guest/bin/`, static C, PID 1 of the guest after
switch_root) over two virtio-serial ports. QEMU serves each port as a Unix socket on the
host (`-chardev socket,id=ctl,path=…/ctl.sock,server=on,wait=off -device
virtserialport,chardev=ctl,name=corral.ctl`, the same for `corral.data`). In the guest the
ports are character devices; the agent is given their paths as arguments:

    corral-vmagent --ctl /dev/vport0p1 --data /dev/vport0p2

(a PATH naming a Unix socket is connected to, as a client, so the reopening can be tested on
the host; for tests the same binary also takes any two bidirectional fds: `--ctl-fd N
--data-fd M`; `--no-system` makes HELLO leave the clock, the hostname and /etc/machine-id
alone, for tests on the host).

Why two ports: the control port carries only small messages (requests, replies, credits,
pings), so a process printing without end (its output is on the data port) can never
delay a health check, a signal or another command's reply. Why credits: the data port is
shared by every stream; a stream may have at most its window of bytes in flight, so no
reader (host or guest) ever buffers more than windows it granted, and one slow stream
does not stop others.

## Frames (both ports, both directions)

    u32 LE  length of the payload (0 … 65536; a larger length is a protocol error: the
            receiver drops the connection, the host then ends the sandbox as unresponsive)
    u32 LE  stream id (0: the connection itself; otherwise chosen by the host per request)
    u16 LE  type (below)
    u16 LE  flags (0; reserved)
    payload

Control payloads are fields: a sequence of NUL-terminated `key=value` strings (the value
may contain `=`; keys repeat where said: `arg`, `env`). Unknown keys are ignored. Data
payloads are raw bytes.

## Types

- 1 HELLO (ctl, host→guest): `time_ns` (wall clock, ns since epoch), `entropy` (hex, 64
  bytes: mixed into the guest's RNG with RNDADDENTROPY), `hostname` (set), `machine_id` (32
  hex: written to /etc/machine-id on a tmpfs bind, best effort)
- 2 HELLO_OK (ctl, guest→host): `version=1`, `pid` (the agent's, 1)
- 3 PING (ctl, host→guest): (none)
- 4 PONG (ctl, guest→host): same stream id as the PING
- 10 EXEC (ctl, host→guest): `user` (name, uid, or uid:gid; resolved in the guest's
  /etc/passwd and /etc/group; supplementary groups from /etc/group), `cwd`, `arg` (repeated,
  argv in order; PATH searched with the env's PATH), `env` (repeated `K=V`: exactly the
  environment), `stdin` (`1`: the host will send STDIN frames; else /dev/null), `pty`
  (optional `COLSxROWS`: the command runs on a new terminal, stdout and stderr both the
  terminal's output as STDOUT)
- 11 STARTED (ctl, guest→host): `pid` (in the guest). A retried EXEC with a stream id the
  agent already knows gets the same STARTED again, never a second process
- 12 EXIT (data, guest→host): `status` (the raw wait status, decimal). Sent after the
  stream's last STDOUT/STDERR frame (so it is ordered after them). When the command's
  process has exited the agent drains what is readable then (pipes: the bytes FIONREAD
  counted at the exit; a terminal: until a read would block, at most 1 MiB), closes its ends
  and sends EXIT: a background child still holding the pipes does not hold the EXIT (as with
  crun, an exec ends when its process does; RELEASE kills what is left of the session)
- 13 SIGNAL (ctl, host→guest): `signal` (number): sent to the command's whole session
  (`kill(-pid)`); no reply
- 14 STDIN (data, host→guest): bytes for the command's stdin (within the window the guest
  granted)
- 15 STDIN_CLOSE (data, host→guest): (none): closes the command's stdin after the bytes
  before it (on a terminal it closes only the agent's input handle: send ^D for an end of
  file). STDIN after the command exited is dropped (and credited)
- 16 RESIZE (ctl, host→guest): `cols`, `rows`; ERROR `not_a_terminal` when the exec has no
  pty
- 17 RELEASE (ctl, host→guest): the host is done with the stream (after EXIT or after giving
  up): the agent forgets it (kills the session with SIGKILL if it still runs)
- 20 STDOUT (data, guest→host): bytes
- 21 STDERR (data, guest→host): bytes
- 19 ERROR (ctl, guest→host): `code`, `message`: the request on this stream failed (codes
  below)
- 30 CREDIT (ctl, both): `bytes` (decimal): the sender has consumed that many more bytes of
  this stream's data; the peer may send that many more
- 40 FILE_READ (ctl, host→guest): `user`, `path`, `max` (bytes): open a regular file as the
  user (O_NOFOLLOW not needed: permissions are the user's); reply FILE_INFO then FILE_DATA
  frames then FILE_END
- 41 FILE_INFO (ctl, guest→host): the entry's fields (below) of the opened file
- 42 FILE_DATA (data, both): bytes of a file being read (guest→host) or written
  (host→guest), under credit
- 43 FILE_END (data, both): end of a file's bytes; guest→host it may carry `code`,`message`
  when the read failed midway
- 44 FILE_WRITE (ctl, host→guest): `user`, `path`, `mode` (octal, set exactly: the umask
  does not apply): create/truncate as the user, parents made as needed (as the user); the
  guest answers CREDIT (its window, 262144) once the file is open, or ERROR; the host's
  window for a FILE_WRITE starts at 0: it sends nothing before that first CREDIT; then the
  host sends FILE_DATA … FILE_END; the guest answers ENTRY (the written file) or ERROR (also
  midway: the host stops sending then)
- 45 ENTRY (ctl, guest→host): one entry's fields
- 46 STAT (ctl, host→guest): `user`, `path` → ENTRY (lstat: a symlink is described, not
  followed)
- 47 LIST (ctl, host→guest): `user`, `path`, `depth` (1…64) → ENTRY frames (one per entry
  below the directory, down to `depth` levels, all sorted by their path, bytewise; symlinks
  are not followed; a subdirectory the user cannot read is listed, not entered) then
  LIST_END; more than 65536 entries: ERROR `too_many`
- 48 LIST_END (ctl, guest→host): (none)
- 49 MKDIR (ctl, host→guest): `user`, `path` → ENTRY; ERROR `path_exists` if it exists;
  parents made (0755, less the umask)
- 50 REMOVE (ctl, host→guest): `user`, `path` → ENTRY of what was removed (a whole tree for
  a directory; `/`: ERROR `invalid_path`)
- 51 MOVE (ctl, host→guest): `user`, `source`, `destination` → ENTRY of the destination
  (rename; across file systems: ERROR `invalid_path`)

Entry fields: `name`, `path` (absolute), `type` (`file`, `dir`, `symlink`, `other`), `size`,
`mode` (octal permission bits), `uid`, `gid`, `owner` (user name or the uid), `group`,
`mtime_ns`, `target` (a symlink's, when `type=symlink`).

Error codes (as `node/sandboxes/base.py` names them): `path_not_found`, `path_exists`,
`not_a_directory`, `permission_denied`, `invalid_path` (relative path, a directory where a
file is needed, …), `file_too_large` (a read past `max`), `disk_full` (ENOSPC, EDQUOT),
`not_a_terminal`, `no_such_user`, `too_many` (the agent's bounds: streams, forks),
`bad_request` (a malformed request: missing field, bad number), `internal`.

## Windows

Every stream starts with a window of 262144 bytes in each direction: the guest may send
that many STDOUT+STDERR (or FILE_DATA) bytes of a stream before the host's CREDIT frames
grant more; the host may send that many STDIN (or FILE_DATA) bytes before the guest's
CREDIT. A guest stream out of credit stops reading the command's pipe (the command blocks
on write, as on a full pipe). The host grants credit as its consumer takes the bytes.

## Acting for the caller

Every EXEC and every file request runs in a child the agent forks: the child takes the
user's groups, gid and uid (setgroups, setresgid, setresuid: a non-root uid keeps no
capability) before it touches a path, so the guest kernel enforces the user's rights; the
agent's main loop is the only writer of both ports (children hand their bytes and results
to it over pipes/socketpairs). A command starts its own session (setsid), so SIGNAL and
RELEASE reach its whole tree. A command that cannot be started says why on its stderr and
exits 127 (not found) or 126 (other), as a shell does.

## Bounds the agent enforces on itself

At most 1024 live streams; a frame larger than 65536 bytes, an unknown type on a stream it
does not know, or a field list without its NUL ends the connection; requests beyond the
bounds get ERROR `too_many`. The agent is PID 1: it reaps every orphan, ignores the signals
it can, and never exits on its own (if a port closes it reopens it).

## Streams and the connection (details the table leaves open)

- The host chooses stream ids, increasing, never reused within a connection; 0 is the
  connection's (HELLO / HELLO_OK). EXEC and file requests on stream 0: ERROR `bad_request`.
- An exec stream lives in the agent from EXEC until RELEASE (after its EXIT too: a retried
  EXEC still gets its STARTED); a file request's stream ends in the agent with its last
  reply (FILE_END, ENTRY, LIST_END or ERROR). A request on an id that is live and not an
  exec: ERROR `bad_request`.
- `user`: a name (uid and primary gid from /etc/passwd), a uid (its passwd entry's gid, or
  gid = uid when it has none), or `uid:gid`; supplementary groups: the /etc/group entries
  that list the passwd name; no `user`: ERROR `bad_request`. No `cwd`: `/`. No `arg`:
  ERROR `bad_request`. No PATH in the env:
  `/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin`.
- The agent ignores known types on streams it does not know (a frame in flight after a
  stream ended). It ends the connection on: a frame longer than 65536, a type not allowed
  on its port in its direction, a control payload without its final NUL, a CREDIT whose
  `bytes` is not a decimal number (≤ 2^40), and STDIN/FILE_DATA beyond the window it
  granted.
- Ending the connection: the agent kills every stream's session (SIGKILL) and forgets every
  stream; with `--ctl`/`--data` it closes both ports and reopens them after 100 ms (the same
  on end of file or hangup, e.g. the host side disconnected); with `--ctl-fd`/`--data-fd`
  it exits with status 0. The host reconnects and sends HELLO again.
- The host ends the connection (every waiter gets `AgentGone`) on: a frame longer than
  65536, a type not allowed on its port from the guest, fields not well formed (final NUL,
  `key=` in each, UTF-8), a stream id it never opened (ids below its next id are streams
  it is done with: their frames are dropped), a reply type the stream does not expect,
  STDOUT/STDERR/FILE_DATA beyond the window the host granted, any data after EXIT or
  FILE_END, a bad number in `bytes`, `status` or `pid`, an entry without `name`, an
  absolute `path` and a known `type`, more than 65536 entries in a LIST, more than 8192
  replies waiting on one stream. ERROR replies after an exec's STARTED (a RESIZE's) are
  dropped by the host (it checks for a terminal itself).
- HELLO: `time_ns` sets CLOCK_REALTIME; `entropy` is added with RNDADDENTROPY on
  /dev/urandom (where that is not permitted it is written, mixed in without credit);
  `hostname` (≤ 64 bytes) is set; `machine_id` is written to a 4 KiB tmpfs mounted at
  /run/corral-machine-id and bound over /etc/machine-id. All best effort.
- The agent's own buffering: it stops reading commands' output and file children while
  either port's outgoing queue holds more than 256 KiB, and stops reading the host's
  control port while its control queue holds more than 1 MiB.
- Each file request's child holds only its own socket to the agent's main loop (a
  SOCK_SEQPACKET socketpair whose packets are frames in the format above).
"""

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
        except Exception as e:  # a bug here must not leave every waiter hanging
            log.exception("%s: the agent's %s port reader failed", self.name, port)
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
        stream.event.set()  # wake its waiters: they see it is gone
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

    async def hello(
        self,
        *,
        time_ns: int,
        entropy: bytes,
        hostname: str,
        machine_id: str,
        pids: int | None = None,
    ) -> None:
        """Give the guest its wall clock, fresh entropy, its identity and (``pids``) the
        most processes its commands may have at once."""
        fields = {
            "time_ns": str(time_ns),
            "entropy": entropy.hex(),
            "hostname": hostname,
            "machine_id": machine_id,
        }
        if pids is not None:
            fields["pids"] = str(pids)
        async with self._hello_lock:
            if self._closed:
                raise self._gone()
            stream = _Stream(0, frozenset({T.HELLO_OK}))
            self._streams[0] = stream
            try:
                await self._send(0, T.HELLO, encode_fields(fields))
                reply = await self._reply(stream)
                version = dict(decode_fields(reply.payload)).get("version")
                if version != "1":
                    self._fail(f"the agent speaks protocol version {version!r}, not 1")
                    raise self._gone()
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
                if self._released:
                    return  # (released before its exit: no more events)
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
            while stream.send_credit == 0 and not stream.ended and not self._released:
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
