"""The fake backend's terminal, as the layers above the backends see a real one: one
``pty`` stream, input echoed, ``stty size`` following ``resize``, a signal ends it."""

from __future__ import annotations

import signal
from pathlib import Path

from node.sandboxes.base import RootImage
from node.sandboxes.fake import FakeSandboxBackend
from wire.sandboxes import ExecExit, ExecOutput, ExecRequest, PtySize, SandboxSpec


async def test_a_fake_terminal_echoes_answers_its_size_and_ends_on_a_signal() -> None:
    backend = FakeSandboxBackend()
    spec = SandboxSpec(sandbox_id="sbx-f", tenant_id="ten", image="busybox")
    await backend.create(spec, RootImage(digest="sha256:" + "f" * 64, rootfs=Path("/nonexistent")))
    request = ExecRequest(cmd=["bash"], pty=PtySize(cols=80, rows=24))
    process = await backend.exec("sbx-f", request, default_user="user")
    await process.write_stdin(b"stty size\r")
    await process.resize(PtySize(cols=120, rows=40))
    await process.write_stdin(b"stty size\r")
    await process.signal(signal.SIGKILL)
    events = [event async for event in process.events()]
    output = b"".join(e.data for e in events if isinstance(e, ExecOutput))
    assert {e.stream for e in events if isinstance(e, ExecOutput)} == {"pty"}
    assert output == b"$ stty size\r\n24 80\r\n$ stty size\r\n40 120\r\n$ "
    assert isinstance(events[-1], ExecExit) and events[-1].signal == signal.SIGKILL
