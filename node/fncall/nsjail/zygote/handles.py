"""PID 1's handles on the template process and on each spare it forks."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import socket
from typing import Any

from node.fncall.nsjail.zygote.template import _template_main

#: how long PID 1 waits for the template to fork a spare
TEMPLATE_REPLY_S = 10.0


class TemplateGone(RuntimeError):
    """The template process died (the code of a stage may kill it: same uid)."""


class Template:
    """PID 1's handle on the template process (see the package's docstring)."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                mine.close()
                _template_main(theirs)
            finally:
                os._exit(70)
        theirs.close()
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)
        self.sock = mine

    def alive(self) -> bool:
        return not select.select([self.pidfd], [], [], 0)[0]

    def keep(self) -> frozenset[int]:
        """The pids a kill-all must spare: the template's, while it lives."""
        return frozenset((self.pid,)) if self.alive() else frozenset()

    def check(self, timeout: float = TEMPLATE_REPLY_S) -> None:
        """Raise ``TemplateGone`` unless the template answers within ``timeout`` (resumed
        first: the code may have stopped it)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)
        try:
            self.sock.send(b"ping")
            ready, _, _ = select.select([self.sock], [], [], timeout)
            reply = self.sock.recv(256) if ready else None
        except OSError as exc:
            raise TemplateGone(f"the template process is gone: {exc}") from exc
        if reply != b"pong":
            raise TemplateGone(f"the template process did not answer ({reply!r})")

    def fork_spare(self, fds: list[int]) -> int:
        """A new spare holding ``fds`` (the child's ends of its pipes): its pid. The spare
        is PID 1's child by the time this returns."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)  # code may have stopped it
        try:
            socket.send_fds(self.sock, [b"spare"], fds)
            ready, _, _ = select.select([self.sock], [], [], TEMPLATE_REPLY_S)
            reply = self.sock.recv(256) if ready else None
        except OSError as exc:
            raise TemplateGone(f"the template process is gone: {exc}") from exc
        if reply is None:
            raise TemplateGone("the template process did not answer")
        if not reply:
            raise TemplateGone("the template process is gone")
        if not reply.startswith(b"pid "):
            raise OSError(errno.EAGAIN, reply.decode("utf-8", "replace"))
        return int(reply[4:])


class Spare:
    """PID 1's handle on a spare: forked by the template ahead of time (so the fork is
    off the call's critical path), blocked until it is handed its stage, used once."""

    def __init__(self, template: Template) -> None:
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        st_r, st_w = os.pipe2(os.O_CLOEXEC)
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        try:
            self.pid = template.fork_spare([out_w, err_w, st_w, go_r])
            self.pidfd = os.pidfd_open(self.pid)
        except BaseException:
            for fd in (out_r, err_r, st_r, go_w):
                os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w, st_w, go_r):
                os.close(fd)
        self.fds = (out_r, err_r, st_r)
        self._go = go_w

    def start(self, stage: dict[str, Any]) -> bool:
        """Hand the stage over; False if the spare is gone (then discard it)."""
        data = json.dumps(stage).encode()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._go, view) :]
        except OSError:
            return False
        finally:
            os.close(self._go)
        return True

    def discard(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        for fd in (self.pidfd, *self.fds):
            os.close(fd)
