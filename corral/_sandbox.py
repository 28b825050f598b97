"""``Sandbox`` and ``AsyncSandbox``: one sandbox, its commands and its files.

A sandbox keeps its files and processes between calls until ``kill()``, its TTL or its
idle timeout; used as a context manager, it is destroyed when the block ends.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import logging
from collections.abc import AsyncIterable, Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO

import httpx

from corral._api import (
    ExecStream,
    FileData,
    async_file_content,
    drop_none,
    exec_body,
    exec_read_timeout,
    file_content,
    file_mode,
    one,
)
from corral._errors import CorralError, NotFound
from corral._models import ExecResult, FileEntry, SandboxInfo
from corral._terminal import AsyncTerminal

if TYPE_CHECKING:
    from corral._client import AsyncCorral, Corral

log = logging.getLogger("corral")

#: called with each chunk of output as it arrives (an async sandbox also awaits what it returns)
OutputCallback = Callable[[str], object]
DEFAULT_EXEC_TIMEOUT_S = 60.0


def _exec_timeout(client: Corral | AsyncCorral, timeout_s: float | None) -> httpx.Timeout:
    return httpx.Timeout(client.timeout, read=exec_read_timeout(timeout_s, client.timeout))


class Sandbox:
    """A sandbox: ``.exec()`` commands, ``.files``, ``.pause()``, ``.kill()``..."""

    def __init__(self, client: Corral, info: SandboxInfo) -> None:
        self._client = client
        self.info = info
        self.files = Files(client, info.id)

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def state(self) -> str:
        """As of the last answer about it (``refresh()`` asks again)."""
        return self.info.state

    def exec(
        self,
        cmd: list[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        stdin: str | None = None,
        timeout_s: float | None = DEFAULT_EXEC_TIMEOUT_S,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (an argv, or a string for ``/bin/sh -c``) and return its outcome.

        ``timeout_s`` kills the command's whole session (None: never). With ``on_stdout``
        or ``on_stderr`` the output is streamed: each is called with every chunk as it
        arrives, and the result still holds all of it.
        """
        stream = on_stdout is not None or on_stderr is not None
        body = exec_body(
            cmd, env=env, cwd=cwd, user=user, stdin=stdin, timeout_s=timeout_s, stream=stream
        )
        path, timeout = one(self.id, "/exec"), _exec_timeout(self._client, timeout_s)
        if not stream:
            return ExecResult.from_json(
                self._client._json("POST", path, json=body, timeout=timeout)
            )
        events = ExecStream()
        callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        with self._client._stream("POST", path, json=body, timeout=timeout) as response:
            for line in response.iter_lines():
                chunk = events.feed(line)
                if chunk is not None and (callback := callbacks[chunk[0]]) is not None:
                    callback(chunk[1])
        return events.result()

    def _update(self, method: str, tail: str = "", **kwargs: Any) -> SandboxInfo:
        self.info = SandboxInfo.from_json(self._client._json(method, one(self.id, tail), **kwargs))
        return self.info

    def refresh(self) -> SandboxInfo:
        """The record now, with its memory and CPU readings."""
        return self._update("GET")

    def pause(self) -> None:
        """Freeze every process (a command sent meanwhile is refused: SandboxNotRunning)."""
        self._update("POST", "/pause")

    def resume(self) -> None:
        self._update("POST", "/resume")

    def set_timeout(self, ttl_s: float) -> None:
        """End the sandbox ``ttl_s`` seconds from now."""
        self._update("POST", "/timeout", json={"ttl_s": ttl_s})

    def kill(self) -> None:
        """Destroy it (its files and processes): acknowledged at once (``stopping``, it
        takes no more calls), torn down right after (``stopped``); killing a sandbox
        destroyed already does nothing."""
        self._update("DELETE")

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.kill()
        except CorralError:
            if exc_type is None:
                raise
            log.warning("sandbox %s: not destroyed after an error", self.id, exc_info=True)

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, state={self.state!r})"


class Files:
    """``sandbox.files``: paths inside the sandbox (a relative one is taken from ``/``)."""

    def __init__(self, client: Corral, sandbox_id: str) -> None:
        self._client = client
        self._path = one(sandbox_id, "/files")

    def _entry(self, method: str, tail: str, **kwargs: Any) -> FileEntry:
        return FileEntry.from_json(self._client._json(method, self._path + tail, **kwargs))

    def write(
        self, path: str, data: FileData, *, user: str | None = None, mode: int | None = None
    ) -> FileEntry:
        """Create or replace a file (a string is written as UTF-8); parents are made. A
        binary file object (``open(p, "rb")``) or an iterable of byte chunks is streamed
        as it is read, whatever its size (up to the gateway's ``max_file_bytes``)."""
        params = drop_none(path=path, user=user, mode=file_mode(mode))
        return self._entry("PUT", "", params=params, content=file_content(data))

    def read(self, path: str, *, user: str | None = None) -> bytes:
        """A file's bytes, whole (``read_into`` streams a large one)."""
        params = drop_none(path=path, user=user)
        return self._client._send("GET", self._path, params=params).content

    def read_into(self, path: str, target: BinaryIO, *, user: str | None = None) -> int:
        """Stream a file's bytes into ``target`` (a binary file object) as they arrive,
        never held whole; answers how many were written."""
        params = drop_none(path=path, user=user)
        written = 0
        with self._client._stream("GET", self._path, params=params) as answer:
            for chunk in answer.iter_bytes():
                target.write(chunk)
                written += len(chunk)
        return written

    def read_text(self, path: str, encoding: str = "utf-8", *, user: str | None = None) -> str:
        return self.read(path, user=user).decode(encoding)

    def list(
        self, path: str, *, depth: int = 1, user: str | None = None
    ) -> builtins.list[FileEntry]:
        """A directory's entries, and theirs down to ``depth`` levels (every page)."""
        entries: builtins.list[FileEntry] = []
        cursor: str | None = None
        while True:
            params = drop_none(path=path, depth=depth, user=user, cursor=cursor)
            body = self._client._json("GET", self._path + "/list", params=params)
            entries += [FileEntry.from_json(e) for e in body["entries"]]
            cursor = body.get("next_cursor")
            if not cursor:
                return entries

    def stat(self, path: str, *, user: str | None = None) -> FileEntry:
        return self._entry("GET", "/stat", params=drop_none(path=path, user=user))

    def exists(self, path: str, *, user: str | None = None) -> bool:
        try:
            self.stat(path, user=user)
        except NotFound:
            return False
        return True

    def mkdir(self, path: str, *, user: str | None = None) -> FileEntry:
        """Make a directory and its parents."""
        return self._entry("POST", "/mkdir", json=drop_none(path=path, user=user))

    def remove(self, path: str, *, user: str | None = None) -> None:
        """Remove a file or a whole directory tree."""
        self._client._send("POST", self._path + "/remove", json=drop_none(path=path, user=user))

    def move(self, source: str, destination: str, *, user: str | None = None) -> FileEntry:
        body = drop_none(source=source, destination=destination, user=user)
        return self._entry("POST", "/move", json=body)


class AsyncSandbox:
    """The asynchronous twin of ``Sandbox`` (``async with`` destroys it at the end)."""

    def __init__(self, client: AsyncCorral, info: SandboxInfo) -> None:
        self._client = client
        self.info = info
        self.files = AsyncFiles(client, info.id)

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def state(self) -> str:
        return self.info.state

    async def exec(
        self,
        cmd: list[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        stdin: str | None = None,
        timeout_s: float | None = DEFAULT_EXEC_TIMEOUT_S,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ExecResult:
        """As ``Sandbox.exec``; a callback may be a coroutine function."""
        stream = on_stdout is not None or on_stderr is not None
        body = exec_body(
            cmd, env=env, cwd=cwd, user=user, stdin=stdin, timeout_s=timeout_s, stream=stream
        )
        path, timeout = one(self.id, "/exec"), _exec_timeout(self._client, timeout_s)
        if not stream:
            answer = await self._client._json("POST", path, json=body, timeout=timeout)
            return ExecResult.from_json(answer)
        events = ExecStream()
        callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        async with self._client._stream("POST", path, json=body, timeout=timeout) as response:
            async for line in response.aiter_lines():
                chunk = events.feed(line)
                if chunk is not None and (callback := callbacks[chunk[0]]) is not None:
                    returned = callback(chunk[1])
                    if inspect.isawaitable(returned):
                        await returned
        return events.result()

    def terminal(self, *, cols: int = 80, rows: int = 24) -> AsyncTerminal:
        """A login shell on a terminal of the sandbox's own, over a WebSocket: use it in
        ``async with`` (``corral._terminal`` says how)."""
        base = self._client.url.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
        url = f"{base}{one(self.id, '/terminal')}?cols={cols}&rows={rows}"
        auth = self._client._http.headers.get("authorization")
        return AsyncTerminal(url, {"Authorization": auth} if auth else {})

    async def _update(self, method: str, tail: str = "", **kwargs: Any) -> SandboxInfo:
        answer = await self._client._json(method, one(self.id, tail), **kwargs)
        self.info = SandboxInfo.from_json(answer)
        return self.info

    async def refresh(self) -> SandboxInfo:
        return await self._update("GET")

    async def pause(self) -> None:
        await self._update("POST", "/pause")

    async def resume(self) -> None:
        await self._update("POST", "/resume")

    async def set_timeout(self, ttl_s: float) -> None:
        await self._update("POST", "/timeout", json={"ttl_s": ttl_s})

    async def kill(self) -> None:
        await self._update("DELETE")

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.kill()
        except CorralError:
            if exc_type is None:
                raise
            log.warning("sandbox %s: not destroyed after an error", self.id, exc_info=True)

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self.id!r}, state={self.state!r})"


class AsyncFiles:
    """``sandbox.files`` of an ``AsyncSandbox``."""

    def __init__(self, client: AsyncCorral, sandbox_id: str) -> None:
        self._client = client
        self._path = one(sandbox_id, "/files")

    async def _entry(self, method: str, tail: str, **kwargs: Any) -> FileEntry:
        return FileEntry.from_json(await self._client._json(method, self._path + tail, **kwargs))

    async def write(
        self,
        path: str,
        data: FileData | AsyncIterable[bytes],
        *,
        user: str | None = None,
        mode: int | None = None,
    ) -> FileEntry:
        """``Files.write``; an async iterable of chunks streams too."""
        params = drop_none(path=path, user=user, mode=file_mode(mode))
        content = await async_file_content(data)
        return await self._entry("PUT", "", params=params, content=content)

    async def read(self, path: str, *, user: str | None = None) -> bytes:
        params = drop_none(path=path, user=user)
        return (await self._client._send("GET", self._path, params=params)).content

    async def read_into(self, path: str, target: BinaryIO, *, user: str | None = None) -> int:
        """``Files.read_into``: ``target`` is written off the event loop."""
        params = drop_none(path=path, user=user)
        written = 0
        async with self._client._stream("GET", self._path, params=params) as answer:
            async for chunk in answer.aiter_bytes():
                await asyncio.to_thread(target.write, chunk)
                written += len(chunk)
        return written

    async def read_text(
        self, path: str, encoding: str = "utf-8", *, user: str | None = None
    ) -> str:
        return (await self.read(path, user=user)).decode(encoding)

    async def list(
        self, path: str, *, depth: int = 1, user: str | None = None
    ) -> builtins.list[FileEntry]:
        entries: builtins.list[FileEntry] = []
        cursor: str | None = None
        while True:
            params = drop_none(path=path, depth=depth, user=user, cursor=cursor)
            body = await self._client._json("GET", self._path + "/list", params=params)
            entries += [FileEntry.from_json(e) for e in body["entries"]]
            cursor = body.get("next_cursor")
            if not cursor:
                return entries

    async def stat(self, path: str, *, user: str | None = None) -> FileEntry:
        return await self._entry("GET", "/stat", params=drop_none(path=path, user=user))

    async def exists(self, path: str, *, user: str | None = None) -> bool:
        try:
            await self.stat(path, user=user)
        except NotFound:
            return False
        return True

    async def mkdir(self, path: str, *, user: str | None = None) -> FileEntry:
        return await self._entry("POST", "/mkdir", json=drop_none(path=path, user=user))

    async def remove(self, path: str, *, user: str | None = None) -> None:
        body = drop_none(path=path, user=user)
        await self._client._send("POST", self._path + "/remove", json=body)

    async def move(self, source: str, destination: str, *, user: str | None = None) -> FileEntry:
        body = drop_none(source=source, destination=destination, user=user)
        return await self._entry("POST", "/move", json=body)
