"""Commands started by the sandbox's own PID 1 (``corral-init``), not by ``crun exec``.

``crun exec`` costs a runtime process, a fresh join of every namespace and cgroup, and a
seccomp filter compiled again for each command. ``corral-init`` already sits inside all
of them: given a listening socket at creation (``crun run --preserve-fds 1``; the socket
is bound at ``<sandbox dir>/spawn.sock`` on the host, outside the sandbox's root, so no
process inside can reach it), it forks each command the node asks for, as the user asked
for, with the node's pipes as its stdio (node/sandboxes/guest/corral-init.c describes the
protocol). The command's pid as the host sees it comes with SCM_CREDENTIALS (translated
by the kernel); its wait status when it ends. ``Spawned`` looks to ``CrunProcess`` like
the ``asyncio.subprocess.Process`` of a ``crun exec``.

A command on a terminal (``pty``) gets no pipes: the init's child allocates the terminal
inside the sandbox and sends its master back with the 'P'. The node never opens a path of
the sandbox for it, and takes the descriptor only if it is a terminal's master (a
character device 5:2, which answers TIOCGPTN): anything else a hostile sandbox could
pass is closed and the command refused. The node's stdin writer and stdout reader are
that master (two descriptors of it); resizing is TIOCSWINSZ on it.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import os
import signal
import socket
import stat
import struct
import termios
from collections.abc import Iterator, Mapping
from pathlib import Path

from node.pipes import PipeReader, PipeWriter
from node.sandboxes.base import SandboxUnresponsive
from wire.sandboxes import PtySize

SOCKET_NAME = "spawn.sock"
_UCRED = struct.Struct("iII")
_WINSIZE = struct.Struct("HHHH")
#: a terminal's master, as its ptmx device: /dev/ptmx and every devpts instance's ptmx
PTMX = (5, 2)
_TIOCGPTN = getattr(termios, "TIOCGPTN", 0x80045430)
#: the longest wait for the sandbox's init to take a command and start it
START_S = 10.0


class SpawnRefused(SandboxUnresponsive):
    """The sandbox's init could not start the command (its processes are at their limit)."""


@contextlib.contextmanager
def short_address(path: Path) -> Iterator[str]:
    """``path`` as a Unix socket address within the 108 bytes one may have (through the
    directory's descriptor: a data dir may be deep)."""
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{directory}/{path.name}"
    finally:
        os.close(directory)


def listener(path: Path) -> socket.socket:
    """The listening socket a sandbox's init is started with (inheritable: the runtime
    passes it on as fd 3)."""
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with short_address(path) as address:
            sock.bind(address)
        os.chmod(path, 0o600)
        sock.listen(256)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def _request(
    argv: list[str],
    env: Mapping[str, str],
    uid: int,
    gid: int,
    cwd: str,
    pty: PtySize | None = None,
) -> bytes:
    fields = [] if pty is None else ["pty", str(pty.cols), str(pty.rows)]
    fields += [str(uid), str(gid), cwd, str(len(argv)), *argv]
    fields += [f"{k}={v}" for k, v in env.items()]
    body = b"".join(f.encode() + b"\0" for f in fields)
    return struct.pack("<I", len(body)) + body


def is_master(fd: int) -> bool:
    """Whether ``fd`` is a terminal's master (what a sandbox's init must send for a
    command on a terminal), open for reading and writing."""
    try:
        info = os.fstat(fd)
        device = (os.major(info.st_rdev), os.minor(info.st_rdev))
        if not stat.S_ISCHR(info.st_mode) or device != PTMX:
            return False
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDWR:
            return False
        fcntl.ioctl(fd, _TIOCGPTN, b"\0\0\0\0")
    except OSError:
        return False
    return True


def resize(fd: int, size: PtySize) -> None:
    """Set the size of the terminal whose master is ``fd`` (the kernel signals SIGWINCH
    to its foreground process group)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, _WINSIZE.pack(size.rows, size.cols, 0, 0))


class Spawned:
    """A command ``corral-init`` forked: its pipes, its host pid and its exit."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.stdin: PipeWriter | None = None
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None
        #: a command on a terminal: ``stdin`` and ``stdout`` are its master's
        self.terminal = False
        self.pid = 0  #: the host's pid of the command (0 if it never started)
        self.returncode: int | None = None
        self._ended: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._watcher: asyncio.Task[None] | None = None
        self._readers: list[PipeReader] = []

    def close(self) -> None:
        """Close the node's ends of the pipes (a background child still holding the
        command's stdout must not hold a descriptor of the node)."""
        if self.stdin is not None:
            self.stdin.close()
        for reading in self._readers:
            reading.close()

    async def _receive(self, size: int) -> tuple[bytes, int | None, list[int]]:
        """Up to ``size`` bytes, the sender's pid if credentials came with them, and the
        descriptors that came with them (at most one is taken: the rest are closed)."""
        loop = asyncio.get_running_loop()
        room = socket.CMSG_SPACE(_UCRED.size) + socket.CMSG_SPACE(4)
        while True:
            try:
                data, ancillary, flags, _ = self._sock.recvmsg(size, room, socket.MSG_CMSG_CLOEXEC)
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_reader(self._sock.fileno(), ready.set_result, None)
                try:
                    await ready
                finally:
                    loop.remove_reader(self._sock.fileno())
                continue
            pid = None
            fds: list[int] = []
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = _UCRED.unpack(payload[: _UCRED.size])[0]
                elif level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    whole = len(payload) - len(payload) % 4
                    fds += array.array("i", payload[:whole]).tolist()
            if flags & socket.MSG_CTRUNC or len(fds) > 1:
                for fd in fds:
                    os.close(fd)
                fds = []
            return data, pid, fds

    async def _started(self, sandbox: str, terminal: bool = False) -> int | None:
        """Wait for the command's 'P' (or its end, if it never got that far), at most
        ``START_S``: an init that does not answer fails the exec, it does not hang it.
        ``terminal``: the 'P' must carry the terminal's master, returned."""
        try:
            async with asyncio.timeout(START_S):
                data, pid, fds = await self._receive(1)
        except TimeoutError:
            raise SandboxUnresponsive(
                f"{sandbox}'s init did not start the command within {START_S:g} s"
            ) from None
        master = fds[0] if fds else None
        if master is not None and not (terminal and is_master(master)):
            os.close(master)  # nothing but a terminal's master is taken from a sandbox
            master = None
        if data == b"P" and pid:
            self.pid = pid
            self._watcher = asyncio.create_task(self._watch(b""))
            if terminal and master is None:
                self.kill()
                raise SpawnRefused(f"{sandbox}'s init sent no terminal for the command")
        else:
            self._watcher = asyncio.create_task(self._watch(data))
            if data[:1] == b"E":
                raise SpawnRefused(
                    f"{sandbox}'s init could not start the command "
                    "(its processes may be at their limit)"
                )
            if terminal:  # ended before its 'P': it never had its terminal
                raise SpawnRefused(f"{sandbox}'s init could not give the command a terminal")
        return master

    async def _watch(self, pending: bytes) -> None:
        try:
            while len(pending) < 5:
                data, _, fds = await self._receive(5 - len(pending))
                for fd in fds:
                    os.close(fd)
                if not data:
                    raise ConnectionError("the sandbox's init closed the connection")
                pending += data
            if pending[:1] != b"X":
                raise ConnectionError(f"unexpected answer {pending[:1]!r}")
            (status,) = struct.unpack("<i", pending[1:5])
            code = os.waitstatus_to_exitcode(status)
        except (ConnectionError, OSError, SpawnRefused):
            code = -int(signal.SIGKILL)  # the sandbox's init is gone: so is the command
        finally:
            self._sock.close()
        self.returncode = code
        if not self._ended.done():
            self._ended.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)

    def kill(self) -> None:
        if self.pid and self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)


async def spawn(
    path: Path,
    argv: list[str],
    *,
    env: Mapping[str, str],
    uid: int,
    gid: int,
    cwd: str,
    sandbox_id: str | None = None,
    pty: PtySize | None = None,
) -> Spawned:
    """Start ``argv`` in the sandbox (``sandbox_id``) whose init listens at ``path``: with
    the node's pipes as its stdio, or on a terminal of ``pty``'s size."""
    name = f"sandbox {sandbox_id or path.parent.name}"
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    sock.setblocking(False)
    ours: list[int] = []
    theirs: list[int] = []
    try:
        with short_address(path) as address:
            try:
                async with asyncio.timeout(START_S):
                    await loop.sock_connect(sock, address)
            except TimeoutError:
                raise SandboxUnresponsive(
                    f"{name}'s init did not take the command within {START_S:g} s"
                ) from None
        for node_reads in (False, True, True) if pty is None else ():
            read_end, write_end = os.pipe2(os.O_CLOEXEC)
            ours.append(read_end if node_reads else write_end)
            theirs.append(write_end if node_reads else read_end)
        message = _request(argv, env, uid, gid, cwd, pty)
        fds = array.array("i", theirs)
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)] if theirs else []
        sent = sock.sendmsg([message], rights)
        if sent < len(message):
            await loop.sock_sendall(sock, message[sent:])
    except BaseException:
        sock.close()
        for fd in ours + theirs:
            os.close(fd)
        raise
    for fd in theirs:
        os.close(fd)
    process = Spawned(sock)
    if pty is not None:
        return await _on_terminal(process, name)
    # not the loop's pipe transports: ``node.pipes`` says why
    process.stdin = PipeWriter(ours[0])
    readers = [asyncio.StreamReader(limit=1 << 20, loop=loop) for _ in ours[1:]]
    process._readers = [PipeReader(fd, r) for fd, r in zip(ours[1:], readers, strict=True)]
    process.stdout, process.stderr = readers
    try:
        await process._started(name)
    except BaseException:
        process.close()
        sock.close()
        raise
    return process


async def _on_terminal(process: Spawned, name: str) -> Spawned:
    """The command's terminal: its master as the command's stdin and output."""
    try:
        master = await process._started(name, terminal=True)
    except BaseException:
        if process._watcher is None:
            process._sock.close()
        raise
    assert master is not None
    try:
        writing = os.dup(master)
        fcntl.fcntl(writing, fcntl.F_SETFD, fcntl.FD_CLOEXEC)
    except OSError:
        os.close(master)
        process.kill()
        raise
    loop = asyncio.get_running_loop()
    process.stdin = PipeWriter(writing)
    process.terminal = True
    reader = asyncio.StreamReader(limit=1 << 20, loop=loop)
    process._readers = [PipeReader(master, reader)]
    process.stdout = reader
    return process
