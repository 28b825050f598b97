"""The real guest agent, compiled for the host and run as an ordinary process over
socketpairs (its two ports), with an ``AgentChannel`` on the other ends."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from node.sandboxes.microvm.channel import AgentChannel
from tests.requirements import missing

GUEST = Path(__file__).resolve().parents[5] / "node" / "sandboxes" / "guest"
SOURCE = GUEST / "corral-vmagent.c"
BUILT = GUEST / "bin" / "corral-vmagent"


@pytest.fixture(scope="session")
def agent_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent: node/sandboxes/guest/bin's when it is newer than its source, else
    compiled (static, as setup-sandboxes.sh builds it) into a temporary directory."""
    if BUILT.exists() and BUILT.stat().st_mtime >= SOURCE.stat().st_mtime:
        return BUILT
    gcc = shutil.which("gcc")
    if gcc is None:
        missing("gcc is not installed (scripts/setup-sandboxes.sh)")
    out = tmp_path_factory.mktemp("vmagent") / "corral-vmagent"
    subprocess.run(
        [gcc, "-static", "-O2", "-Wall", "-Werror", "-o", str(out), str(SOURCE)], check=True
    )
    return out


def descendants(pid: int) -> set[int]:
    """The processes below ``pid`` (by their parent pids in /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def wait_gone(pids: set[int], seconds: float = 10.0) -> set[int]:
    """The pids of ``pids`` still alive after waiting up to ``seconds`` for them."""
    for _ in range(int(seconds / 0.05)):
        left = {p for p in pids if alive(p)}
        if not left:
            return left
        await asyncio.sleep(0.05)
    return {p for p in pids if alive(p)}


@dataclass
class Agent:
    process: subprocess.Popen[bytes]
    channel: AgentChannel


def spawn(binary: Path, *args: str, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
    """The agent in a session (and process group) of its own."""
    return subprocess.Popen(
        [str(binary), *args, "--no-system"], pass_fds=pass_fds, start_new_session=True
    )


FdAgent = tuple[subprocess.Popen[bytes], socket.socket, socket.socket]


@pytest.fixture
def fd_agent(agent_binary: Path) -> Iterator[FdAgent]:
    """The agent over two socketpairs: (process, host's ctl end, host's data end)."""
    ctl_host, ctl_guest = socket.socketpair()
    data_host, data_guest = socket.socketpair()
    process = None
    try:
        fds = (ctl_guest.fileno(), data_guest.fileno())
        process = spawn(
            agent_binary, "--ctl-fd", str(fds[0]), "--data-fd", str(fds[1]), pass_fds=fds
        )
        ctl_guest.close()
        data_guest.close()
        yield process, ctl_host, data_host
    finally:
        for s in (ctl_host, ctl_guest, data_host, data_guest):
            s.close()
        if process is not None:
            stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    """Ends the agent (it ends its sessions when its ports close) and checks that nothing
    it started is left."""
    below = descendants(process.pid)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    left = {p for p in below if alive(p)}
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, "the agent left processes behind"


@pytest_asyncio.fixture
async def agent(fd_agent: FdAgent) -> AsyncIterator[Agent]:
    process, ctl, data = fd_agent
    channel = await AgentChannel.from_sockets(ctl.dup(), data.dup(), name="test-vm")
    ctl.close()
    data.close()
    try:
        yield Agent(process, channel)
    finally:
        below = descendants(process.pid)
        await channel.close()
        await asyncio.to_thread(process.wait, 10)
        assert process.returncode == 0, "the agent ends cleanly when its ports close"
        assert not await wait_gone(below), "the agent left processes behind"
