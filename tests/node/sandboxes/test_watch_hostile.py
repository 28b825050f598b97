"""Directory watchers against a tenant that takes all it can (issue 29, review finding
#4), on crun and runc, through the node's sandbox API: the node holds one inotify
instance whatever the number of watchers; one tenant's watchers stop at its cap (429)
while another tenant still watches; the kernel refusing a watch is a clear 503, with no
traceback in the node's log."""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from starlette.applications import Starlette

from node.sandboxes import inotify
from node.sandboxes.base import RootImage
from node.sandboxes.http import sandbox_routes
from node.sandboxes.manager import SandboxManager
from node.sandboxes.watch import NodeWatchersFull, WatcherTable, WatchLimits
from tests.node.sandboxes.conftest import spec, started_backend
from wire.sandboxes import ExecRequest, collect

pytestmark = pytest.mark.crun

TOKEN = "node-token"
PER_TENANT = 8


@dataclass
class Node:
    api: httpx.AsyncClient
    manager: SandboxManager

    async def watch(self, sandbox_id: str, path: str = "/tmp") -> httpx.Response:
        return await self.api.post(f"/sandboxes/{sandbox_id}/watchers", json={"path": path})


@pytest_asyncio.fixture(params=["crun", "runc"])
async def node(
    request: pytest.FixtureRequest, tmp_path: Path, busybox_image: RootImage
) -> AsyncIterator[Node]:
    async with started_backend(tmp_path / "data", runtime=request.param) as backend:
        manager = SandboxManager(
            {"crun": backend}, lambda ref: busybox_image, state_dir=tmp_path / "records"
        )
        await manager.start()
        limits = WatchLimits(per_sandbox=32, per_tenant=PER_TENANT, per_node=1024)
        routes = sandbox_routes(manager, TOKEN, node_id="n1", watch_limits=limits)
        transport = httpx.ASGITransport(app=Starlette(routes=routes))
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://node", headers=headers
        ) as api:
            try:
                yield Node(api, manager)
            finally:
                await manager.close()


def inotify_instances() -> int:
    """inotify instances this process (the node) holds."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
        except OSError:
            continue
    return count


async def test_the_node_holds_one_inotify_instance_whatever_its_watchers(node: Node) -> None:
    before = inotify_instances()
    for n in range(3):
        await node.manager.create(spec(f"sbx-many-{n}", tenant_id=f"ten_{n}"))
    made = []
    for n in range(3):
        for path in ("/tmp", "/home/user", "/etc", "/home/user"):  # one watched twice
            answer = await node.watch(f"sbx-many-{n}", path)
            assert answer.status_code == 201, answer.text
            made.append((f"sbx-many-{n}", answer.json()["watcher_id"]))
    assert inotify_instances() <= before + 1  # not one per watcher (12 here)

    # each watcher still sees its own directory's events, the twice-watched one included
    await collect(
        (await node.manager.exec("sbx-many-1", ExecRequest(cmd=["touch", "/home/user/x"]))).events()
    )
    seen = {}
    for sandbox_id, watcher_id in made:
        got = await node.api.get(f"/sandboxes/{sandbox_id}/watchers/{watcher_id}")
        seen[sandbox_id, watcher_id] = {e["name"] for e in got.json()["events"]}
    home = [w for (s, w) in made if s == "sbx-many-1"][1::2]  # its two /home/user watchers
    assert all(seen["sbx-many-1", w] == {"x"} for w in home)
    assert sum(bool(names) for names in seen.values()) == 2  # nobody else saw it

    for sandbox_id, watcher_id in made:
        gone = await node.api.delete(f"/sandboxes/{sandbox_id}/watchers/{watcher_id}")
        assert gone.status_code == 204
    assert inotify_instances() == before  # the instance goes with the last watch


async def test_a_tenant_past_its_watcher_cap_gets_429_and_another_still_watches(
    node: Node,
) -> None:
    for n in range(2):
        await node.manager.create(spec(f"sbx-a{n}", tenant_id="ten_a"))
    await node.manager.create(spec("sbx-b", tenant_id="ten_b"))
    for i in range(PER_TENANT):  # over two sandboxes, each far below its own cap
        answer = await node.watch(f"sbx-a{i % 2}")
        assert answer.status_code == 201, answer.text
    refused = await node.watch("sbx-a0")
    assert refused.status_code == 429
    assert refused.json()["error"] == "watcher_quota_exceeded"

    mine = await node.watch("sbx-b")
    assert mine.status_code == 201, mine.text
    watcher_id = mine.json()["watcher_id"]
    await collect(
        (await node.manager.exec("sbx-b", ExecRequest(cmd=["touch", "/tmp/b-file"]))).events()
    )
    events = (await node.api.get(f"/sandboxes/sbx-b/watchers/{watcher_id}")).json()
    assert [e["name"] for e in events["events"]] == ["b-file"]


async def test_the_kernel_refusing_a_watch_is_a_503_and_no_traceback(
    node: Node, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As when the host's inotify instances are all taken (EMFILE)."""
    await node.manager.create(spec("sbx-emfile", tenant_id="ten_e"))

    class NoInstances:
        def inotify_init1(self, flags: int) -> int:
            ctypes.set_errno(errno.EMFILE)
            return -1

    monkeypatch.setattr(inotify, "_libc", NoInstances())
    if hasattr(inotify, "Inotify"):  # no instance of the node's yet: the next is made
        monkeypatch.setattr(inotify.Inotify, "_shared", None)
    caplog.set_level(logging.INFO)
    for _ in range(3):
        refused = await node.watch("sbx-emfile")
        assert refused.status_code == 503
        assert refused.json()["error"] == "no_capacity"
    assert not [r for r in caplog.records if r.exc_info]


async def test_the_node_stops_at_its_own_cap_of_watchers(node: Node) -> None:
    table = WatcherTable(node.manager, WatchLimits(per_sandbox=32, per_tenant=32, per_node=3))
    for n in range(4):
        await node.manager.create(spec(f"sbx-n{n}", tenant_id=f"ten_n{n}"))
    for n in range(3):
        await table.create(f"sbx-n{n}", "/tmp")
    with pytest.raises(NodeWatchersFull) as full:
        await table.create("sbx-n3", "/tmp")
    assert (full.value.status, full.value.code) == (503, "no_capacity")
    table.close()


async def test_a_watched_path_cannot_forge_or_flood_the_nodes_log(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """Review #12: the path is the tenant's text; the node's line about the watcher keeps
    it escaped and bounded (a newline in it forged a line of the node's log, and a long
    one filled it)."""
    await node.manager.create(spec("sbx-logs", tenant_id="ten_l"))
    name = "a\n2026-12-05 CRITICAL node: forged\x1b[2J" + "x" * 200
    made = await node.manager.exec("sbx-logs", ExecRequest(cmd=["mkdir", f"/tmp/{name}"]))
    assert (await collect(made.events())).exit_code == 0
    caplog.set_level(logging.INFO, logger="node.sandboxes.watch")
    answer = await node.watch("sbx-logs", f"/tmp/{name}")
    assert answer.status_code == 201, answer.text
    lines = [r.getMessage() for r in caplog.records if r.name == "node.sandboxes.watch"]
    assert any("watcher" in line for line in lines)
    for line in lines:
        assert "\n" not in line and "\x1b" not in line
        assert len(line.encode()) < 220  # ~100 bytes of the tenant's text, ids and words
    assert any("a\\n2026-12-05 CRITICAL" in line for line in lines)
