"""An in-memory sandbox backend for unit tests of everything above the backends.

Files live in a dict per sandbox; a command "runs" by a tiny interpreter that knows
``echo ARGS``, ``cat PATH``, ``exit N``, ``sleep S`` and ``env``, enough to test routing,
streaming, records and timeouts without a container. A command on a terminal
(``ExecRequest.pty``) is ``FakeTerminal``: a line discipline that echoes its input and a
shell that knows ``echo ARGS``, ``stty size`` and ``exit N``. Only with ``dev_mode``.
"""

from __future__ import annotations

import asyncio
import base64
import posixpath
import time
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from node.sandboxes import rooted
from node.sandboxes.base import (
    FileStream,
    FileTooLarge,
    PathExists,
    PathNotFound,
    Process,
    RootImage,
    SandboxBackend,
    SandboxNotFound,
    SandboxNotRunning,
    SnapshotFiles,
    Usage,
    register,
)
from wire.sandboxes import (
    MAX_PAGE,
    EntryPage,
    ExecEvent,
    ExecExit,
    ExecOutput,
    ExecRequest,
    ExecStarted,
    FileEntry,
    FileType,
    Phases,
    PtySize,
    SandboxSpec,
)

if TYPE_CHECKING:
    from node.settings import NodeSettings


class _Sandbox:
    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.paused = False
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = {"/", "/home", "/home/user", "/tmp"}


class FakeProcess(Process):
    def __init__(self, sandbox: _Sandbox, request: ExecRequest, pid: int) -> None:
        self.pid = pid
        self._sandbox = sandbox
        self._request = request
        self._killed: int | None = None

    async def events(self) -> AsyncIterator[ExecEvent]:
        started = time.monotonic()
        yield ExecStarted(pid=self.pid)
        cmd, args = self._request.cmd[0], self._request.cmd[1:]
        code: int | None = 0
        timed_out = False
        if cmd == "echo":
            yield ExecOutput(stream="stdout", data=(" ".join(args) + "\n").encode())
        elif cmd == "cat":
            data = self._sandbox.files.get(rooted.normalise(args[0], home="/home/user"))
            if data is None:
                yield ExecOutput(stream="stderr", data=f"cat: {args[0]}: No such file\n".encode())
                code = 1
            else:
                yield ExecOutput(stream="stdout", data=data)
        elif cmd == "env":
            env = {**self._sandbox.spec.env, **self._request.env}
            yield ExecOutput(
                stream="stdout", data="".join(f"{k}={v}\n" for k, v in env.items()).encode()
            )
        elif cmd == "exit":
            code = int(args[0])
        elif cmd == "sleep":
            try:
                await asyncio.wait_for(asyncio.sleep(float(args[0])), self._request.timeout_s)
            except TimeoutError:
                timed_out, code = True, None
        else:
            yield ExecOutput(stream="stderr", data=f"{cmd}: command not found\n".encode())
            code = 127
        yield ExecExit(
            exit_code=code,
            signal=9 if timed_out else None,
            timed_out=timed_out,
            duration_ms=(time.monotonic() - started) * 1000,
        )

    async def signal(self, signum: int) -> None:
        self._killed = signum

    async def write_stdin(self, data: bytes) -> None:
        return None

    async def close_stdin(self) -> None:
        return None


class FakeTerminal(Process):
    """A command on a fake terminal: what it is sent is echoed (a carriage return as
    ``\r\n``, as a terminal in its default mode does) and each line run by a tiny shell:
    ``echo ARGS``, ``stty size`` (the terminal's rows and columns: ``resize`` changes
    them) and ``exit N``; a prompt ``$ `` after each. It ends on ``exit``, a signal or
    its timeout."""

    def __init__(self, request: ExecRequest, pid: int) -> None:
        assert request.pty is not None
        self.pid = pid
        self.size = request.pty
        self.env = dict(request.env)
        self._queue: asyncio.Queue[ExecEvent] = asyncio.Queue()
        self._line = bytearray()
        self._started = time.monotonic()
        self._ended = False
        self._queue.put_nowait(ExecStarted(pid=pid))
        self._output(b"$ ")
        self._timer = (
            asyncio.get_running_loop().call_later(request.timeout_s, self._end, None, 9, True)
            if request.timeout_s is not None
            else None
        )

    async def events(self) -> AsyncIterator[ExecEvent]:
        while True:
            event = await self._queue.get()
            yield event
            if isinstance(event, ExecExit):
                return

    def _output(self, data: bytes) -> None:
        self._queue.put_nowait(ExecOutput(stream="pty", data=data))

    def _end(self, code: int | None, signum: int | None = None, timed_out: bool = False) -> None:
        if self._ended:
            return
        self._ended = True
        if self._timer is not None:
            self._timer.cancel()
        self._queue.put_nowait(
            ExecExit(
                exit_code=code,
                signal=signum,
                timed_out=timed_out,
                duration_ms=(time.monotonic() - self._started) * 1000,
            )
        )

    def _run(self, line: str) -> None:
        words = line.split()
        if not words:
            pass
        elif words[0] == "echo":
            self._output((" ".join(words[1:]) + "\r\n").encode())
        elif words == ["stty", "size"]:
            self._output(f"{self.size.rows} {self.size.cols}\r\n".encode())
        elif words[0] == "exit":
            self._end(int(words[1]) if len(words) > 1 else 0)
            return
        else:
            self._output(f"{words[0]}: command not found\r\n".encode())
        self._output(b"$ ")

    async def write_stdin(self, data: bytes) -> None:
        if self._ended:
            raise BrokenPipeError("the terminal is closed")
        for byte in data:
            if byte in b"\r\n":
                self._output(b"\r\n")
                line, self._line = self._line.decode(errors="replace"), bytearray()
                self._run(line)
            else:
                self._line.append(byte)
                self._output(bytes([byte]))

    async def signal(self, signum: int) -> None:
        self._end(None, signum)

    async def close_stdin(self) -> None:
        return None

    async def resize(self, size: PtySize) -> None:
        self.size = size


class FakeSandboxBackend(SandboxBackend):
    name = "fake"

    def __init__(self, *, accelerator: str | None = None) -> None:
        self._accelerator = accelerator  #: as a machine-backed backend reports one
        self.sandboxes: dict[str, _Sandbox] = {}
        self.snapshots: dict[str, dict[str, bytes]] = {}
        self.create_delay_s = 0.0  #: how long a create takes (tests of admission)
        self._pids = 1

    @property
    def accelerator(self) -> str | None:
        return self._accelerator

    async def start(self) -> list[str]:
        return sorted(self.sandboxes)

    async def close(self) -> None:
        return None

    def _get(self, sandbox_id: str) -> _Sandbox:
        try:
            return self.sandboxes[sandbox_id]
        except KeyError:
            raise SandboxNotFound(f"no sandbox {sandbox_id}") from None

    async def create(self, spec: SandboxSpec, image: RootImage) -> Phases:
        if self.create_delay_s:
            await asyncio.sleep(self.create_delay_s)
        sandbox = self.sandboxes[spec.sandbox_id] = _Sandbox(spec)
        for layer in reversed(image.layers):
            sandbox.files.update(self.snapshots[layer.name])
        for path in sandbox.files:
            parent = posixpath.dirname(path)
            while parent not in sandbox.dirs:
                sandbox.dirs.add(parent)
                parent = posixpath.dirname(parent)
        return Phases(setup_ms=0.1, start_ms=0.1)

    async def claim(self, warm_id: str, spec: SandboxSpec) -> None:
        sandbox = self.sandboxes.pop(warm_id)
        sandbox.spec, sandbox.paused = spec, False
        self.sandboxes[spec.sandbox_id] = sandbox

    async def destroy(self, sandbox_id: str) -> None:
        self.sandboxes.pop(sandbox_id, None)

    async def pause(self, sandbox_id: str) -> None:
        self._get(sandbox_id).paused = True

    async def resume(self, sandbox_id: str) -> None:
        self._get(sandbox_id).paused = False

    async def exec(self, sandbox_id: str, request: ExecRequest, *, default_user: str) -> Process:
        sandbox = self._get(sandbox_id)
        if sandbox.paused:
            raise SandboxNotRunning(f"sandbox {sandbox_id} is paused")
        self._pids += 1
        if request.pty is not None:
            return FakeTerminal(request, self._pids)
        return FakeProcess(sandbox, request, self._pids)

    def _entry(self, sandbox: _Sandbox, path: str) -> FileEntry:
        if path in sandbox.dirs:
            kind, size = FileType.DIR, 4096
        elif path in sandbox.files:
            kind, size = FileType.FILE, len(sandbox.files[path])
        else:
            raise PathNotFound(f"no such file or directory: {path}")
        return FileEntry(
            name=posixpath.basename(path) or "/",
            path=path,
            type=kind,
            size=size,
            mode=0o755 if kind is FileType.DIR else 0o644,
            owner="1000",
            group="1000",
            modified_at=time.time(),
        )

    def _running(self, sandbox_id: str) -> _Sandbox:
        sandbox = self._get(sandbox_id)
        if sandbox.paused:
            raise SandboxNotRunning(f"sandbox {sandbox_id} is paused")
        return sandbox

    async def read_file(
        self, sandbox_id: str, path: str, *, user: str, max_bytes: int
    ) -> FileStream:
        sandbox = self._running(sandbox_id)
        if path not in sandbox.files:
            raise PathNotFound(f"no such file or directory: {path}")
        if len(sandbox.files[path]) > max_bytes:
            raise FileTooLarge(f"{path} is over {max_bytes} bytes")
        return _BytesStream(sandbox.files[path])

    async def write_file(
        self,
        sandbox_id: str,
        path: str,
        chunks: AsyncIterable[bytes],
        *,
        user: str,
        mode: int = 0o644,
    ) -> FileEntry:
        sandbox = self._running(sandbox_id)
        data = b"".join([chunk async for chunk in chunks])
        parent = posixpath.dirname(path)
        while parent not in sandbox.dirs:
            sandbox.dirs.add(parent)
            parent = posixpath.dirname(parent)
        sandbox.files[path] = data
        return self._entry(sandbox, path)

    async def list_dir(
        self,
        sandbox_id: str,
        path: str,
        *,
        user: str,
        depth: int = 1,
        limit: int = MAX_PAGE,
        cursor: str | None = None,
    ) -> EntryPage:
        sandbox = self._running(sandbox_id)
        if path not in sandbox.dirs:
            raise PathNotFound(f"no such directory: {path}")
        names = sorted(
            p for p in (*sandbox.dirs, *sandbox.files) if p != path and posixpath.dirname(p) == path
        )
        padded = (cursor or "") + "=" * (-len(cursor or "") % 4)
        last = base64.urlsafe_b64decode(padded).decode() if cursor else None
        after = [p for p in names if last is None or p > last]
        page = after[:limit]
        more = len(after) > limit
        return EntryPage(
            entries=[self._entry(sandbox, p) for p in page],
            next_cursor=(
                base64.urlsafe_b64encode(page[-1].encode()).decode().rstrip("=") if more else None
            ),
        )

    async def stat(self, sandbox_id: str, path: str, *, user: str) -> FileEntry:
        return self._entry(self._running(sandbox_id), path)

    async def make_dir(self, sandbox_id: str, path: str, *, user: str) -> FileEntry:
        sandbox = self._running(sandbox_id)
        if path in sandbox.dirs or path in sandbox.files:
            raise PathExists(f"already exists: {path}")
        sandbox.dirs.add(path)
        return self._entry(sandbox, path)

    async def remove(self, sandbox_id: str, path: str, *, user: str) -> None:
        sandbox = self._running(sandbox_id)
        if path not in sandbox.files and path not in sandbox.dirs:
            raise PathNotFound(f"no such file or directory: {path}")
        sandbox.files = {p: d for p, d in sandbox.files.items() if not _under(p, path)}
        sandbox.dirs = {p for p in sandbox.dirs if not _under(p, path)}

    async def move(self, sandbox_id: str, source: str, destination: str, *, user: str) -> FileEntry:
        sandbox = self._running(sandbox_id)
        if source not in sandbox.files:
            raise PathNotFound(f"no such file: {source}")
        sandbox.files[destination] = sandbox.files.pop(source)
        return self._entry(sandbox, destination)

    async def usage(self, sandbox_id: str) -> Usage:
        sandbox = self._get(sandbox_id)
        return Usage(
            memory_bytes=1 << 20, cpu_ms=1.0, disk_bytes=sum(map(len, sandbox.files.values()))
        )

    async def snapshot(self, sandbox_id: str, snapshot_id: str) -> SnapshotFiles:
        self.snapshots[snapshot_id] = dict(self._get(sandbox_id).files)
        return self._snapshot(snapshot_id)

    def _snapshot(self, snapshot_id: str) -> SnapshotFiles:
        size = sum(map(len, self.snapshots[snapshot_id].values()))
        return SnapshotFiles(snapshot_id, Path("/fake-snapshots") / snapshot_id, size)

    def snapshot_layer(self, snapshot_id: str) -> SnapshotFiles | None:
        return self._snapshot(snapshot_id) if snapshot_id in self.snapshots else None

    async def delete_snapshot(self, snapshot_id: str) -> None:
        self.snapshots.pop(snapshot_id, None)


class _BytesStream(FileStream):
    """A fake file's bytes, in chunks of at most ``CHUNK`` (as a real stream comes)."""

    CHUNK = 1 << 16

    def __init__(self, data: bytes) -> None:
        self.size = len(data)
        self._data = data

    async def chunks(self) -> AsyncIterator[bytes]:
        for at in range(0, len(self._data), self.CHUNK):
            yield self._data[at : at + self.CHUNK]

    async def close(self) -> None:
        return None


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _create(settings: NodeSettings) -> FakeSandboxBackend:
    if not settings.dev_mode:
        raise ValueError("the fake sandbox backend is for tests only; it needs CORRAL_DEV_MODE=1")
    accelerator = settings.fake.get("sandbox_accelerator")
    return FakeSandboxBackend(accelerator=str(accelerator) if accelerator else None)


register("fake", _create)
