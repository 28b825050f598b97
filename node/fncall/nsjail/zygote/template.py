"""The template process and the spares it forks: its life (fork a spare whenever PID 1
asks), the fork (directly or through a courier), and a spare's wait for its stage."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
from typing import Any, NoReturn

from node.fncall.nsjail.zygote.child import _child
from node.fncall.nsjail.zygote.common import CHUNK, MAX_FD
from node.fncall.nsjail.zygote.siblingfork import SiblingFork, _sibling_fork
from node.fncall.nsjail.zygote.startup import _default_signals


def _template_main(sock: socket.socket) -> NoReturn:
    """The template's life: fork a spare whenever PID 1 asks, until PID 1 is gone."""
    keep = sock.fileno()
    os.closerange(3, keep)  # PID 1's control channel and anything else it held
    os.closerange(keep + 1, MAX_FD)
    # the code of a stage runs as the same user and may signal us: ignore what can be
    # ignored (SIGKILL cannot: PID 1 then sees us gone); SIGCHLD stays default so that
    # couriers can be waited for
    for signum in signal.valid_signals():
        if signum not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            with contextlib.suppress(OSError, ValueError):
                signal.signal(signum, signal.SIG_IGN)
    sibling = _sibling_fork()
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 64, 8)
        except OSError:
            os._exit(71)
        if not message:
            os._exit(0)  # PID 1 is gone
        if message == b"ping":
            for fd in fds:
                os.close(fd)
            sock.send(b"pong")
            continue
        try:
            reply = f"pid {_fork_spare(fds, keep, sibling)}"
        except OSError as exc:
            reply = f"cannot fork a spare: {exc}"
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(reply.encode())


def _fork_spare(fds: list[int], sock_fd: int, sibling: SiblingFork | None = None) -> int:
    """Fork the spare as PID 1's child: directly with ``sibling``, else through a courier
    that forks it and exits (the orphaned spare goes to PID 1)."""
    if sibling is not None:
        spare = sibling.fork()
        if spare == 0:
            try:
                os.close(sock_fd)
                _spare_main(fds)
            finally:
                os._exit(126)
        return spare
    r, w = os.pipe()
    try:
        courier = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        raise
    if courier == 0:
        try:
            os.close(r)
            spare = os.fork()
            if spare == 0:
                os.close(w)
                os.close(sock_fd)
                _spare_main(fds)
            os.write(w, str(spare).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        data = pipe.read()
    os.waitpid(courier, 0)
    if not data:
        raise OSError(errno.EAGAIN, "the courier could not fork")
    return int(data)


def _spare_main(fds: list[int]) -> NoReturn:
    """A spare: wait for the stage on the go pipe, then become the stage's process."""
    try:
        _default_signals()  # PID 1's dispositions, not the template's
        out_w, err_w, st_w, go_r = fds
        stage = _await_stage(go_r)
        if stage is not None:
            _child(stage, (out_w, err_w, st_w))
    finally:
        os._exit(126)


def _await_stage(fd: int) -> dict[str, Any] | None:
    parts: list[bytes] = []
    while chunk := os.read(fd, CHUNK):
        parts.append(chunk)
    os.close(fd)
    if not parts:
        return None  # PID 1 is gone or dropped this spare
    stage = json.loads(b"".join(parts))
    return stage if isinstance(stage, dict) else None
