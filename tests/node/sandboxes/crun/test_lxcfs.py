"""LXCFS that dies is restarted: its mount then answers ENOTCONN to every call, even to the
``mkdir`` that finds its directory, and a sandbox started on it would bind dead files."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.sandboxes.crun import mounts
from node.sandboxes.crun.lxcfs import Lxcfs
from tests.requirements import missing

pytestmark = pytest.mark.crun


@pytest.fixture
def lxcfs(tmp_path: Path) -> Iterator[Lxcfs]:
    if os.geteuid() != 0 or shutil.which("lxcfs") is None:
        missing("lxcfs and root are needed (scripts/setup-sandboxes.sh installs lxcfs)")
    served = Lxcfs(tmp_path / "lxcfs")
    try:
        yield served
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(_pid(served), signal.SIGKILL)
        mounts.unmount(served.directory)


def _pid(served: Lxcfs) -> int:
    return int(Path(f"{served.directory}.pid").read_text().split()[0])


def _kill(served: Lxcfs) -> None:
    pid = _pid(served)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(OSError) as dead:
        served.directory.stat()
    assert dead.value.errno == 107  # ENOTCONN: the mount outlives its server


async def test_a_node_starting_on_a_dead_lxcfs_restarts_it(lxcfs: Lxcfs) -> None:
    assert await lxcfs.ensure()
    _kill(lxcfs)
    again = Lxcfs(lxcfs.directory)  # the next node on this host
    assert await again.ensure()
    assert b"MemTotal" in (lxcfs.directory / "proc" / "meminfo").read_bytes()


def test_a_create_after_lxcfs_died_restarts_it_before_binding_its_files(
    lxcfs: Lxcfs,
) -> None:
    assert asyncio.run(lxcfs.ensure())
    _kill(lxcfs)
    views = lxcfs.views()
    assert views and lxcfs.serving
    for view in views:
        assert os.path.exists(view["source"]), view
