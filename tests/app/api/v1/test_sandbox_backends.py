"""The sandbox API, one behaviour for every backend: the same calls through a real server
give the same answers on a container (``crun``) and on a microVM (``microvm``: QEMU, KVM
where it works, TCG here), with the ``python`` image at the default size (which a
microVM create takes from the node's warm clones). Commands (env, cwd, stdin, users,
exit codes, time-outs, streamed events), files (bytes, owners, pages, moves, errors as the
user), pause and resume, destroy."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.app.api.v1.test_sandboxes import stopped_soon
from tests.app.api.v1.test_sandboxes_crun import python_images_dir
from tests.conftest import ADMIN
from tests.node.sandboxes.microvm.conftest import require_microvm

pytestmark = pytest.mark.slow

BACKENDS = [
    pytest.param("crun", marks=pytest.mark.crun, id="crun"),
    pytest.param("microvm", marks=pytest.mark.microvm, id="microvm"),
]


@pytest.fixture
def server_options(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """The settings of a server whose node offers only ``request.param``'s backend."""
    backend: str = request.param
    options: dict[str, Any] = {"sandbox_backends": [backend], "images_dir": python_images_dir()}
    if backend != "microvm":
        yield options
        return
    require_microvm()
    root = Path(tempfile.mkdtemp(prefix="corral-api-microvm-"))  # QEMU's user reaches it
    root.chmod(0o755)
    try:
        yield options | {
            "sandbox_microvm_dir": root,
            "sandbox_microvm_accelerator": "auto",
            "sandbox_warm": {"python": 1},
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _api(live_server: Callable[..., str], options: dict[str, Any]) -> httpx.Client:
    url = live_server(**options)
    made = httpx.post(f"{url}/v1/tenants", json={"name": "backends"}, headers=ADMIN)
    assert made.status_code == 201, made.text
    key = made.json()["key"]["api_key"]
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def _created(api: httpx.Client, backend: str) -> dict[str, Any]:
    """A sandbox of the default size, once the embedded node's first report has come."""
    deadline = time.monotonic() + 30
    while True:
        created = api.post("/v1/sandboxes", json={"image": "python", "backend": backend})
        if created.status_code != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert created.status_code == 201, created.text
    return dict(created.json())


def _error(answer: httpx.Response) -> tuple[int, str]:
    return answer.status_code, answer.json()["error"]["code"]


@pytest.mark.parametrize("server_options", BACKENDS, indirect=True)
def test_the_sandbox_api_answers_the_same_on_every_backend(
    live_server: Callable[..., str], server_options: dict[str, Any]
) -> None:
    backend = server_options["sandbox_backends"][0]
    with _api(live_server, server_options) as api:
        sbx = _created(api, backend)
        one = f"/v1/sandboxes/{sbx['id']}"
        assert sbx["backend"] == backend and sbx["state"] == "running", sbx
        try:
            _commands(api, one)
            _files(api, one)
            _pause_and_resume(api, one)
        finally:
            assert api.delete(one).status_code == 200
        stopped = stopped_soon(api, {}, sbx["id"])
        assert stopped["backend"] == backend
        assert _error(api.post(f"{one}/exec", json={"cmd": ["true"]}))[0] in (404, 409)


def _commands(api: httpx.Client, one: str) -> None:
    ran = api.post(
        f"{one}/exec",
        json={
            "command": 'echo "$X"; pwd; id -un; cat',
            "env": {"X": "from the env"},
            "cwd": "/tmp",
            "stdin": "from stdin",
        },
    ).json()
    assert ran["exit_code"] == 0, ran
    assert ran["stdout"].splitlines() == ["from the env", "/tmp", "user", "from stdin"], ran
    home = api.post(f"{one}/exec", json={"cmd": ["pwd"]}).json()
    assert home["stdout"] == "/home/user\n", home
    failed = api.post(f"{one}/exec", json={"command": "echo oops >&2; exit 3"}).json()
    assert (failed["exit_code"], failed["stderr"]) == (3, "oops\n"), failed
    root = api.post(f"{one}/exec", json={"cmd": ["id", "-u"], "user": "root"}).json()
    assert root["stdout"] == "0\n", root
    missing = api.post(f"{one}/exec", json={"cmd": ["/no/such/program"]}).json()
    assert missing["exit_code"] not in (0, None) or missing["error"], missing

    started = time.monotonic()
    slow = api.post(f"{one}/exec", json={"command": "sleep 60 & sleep 60", "timeout_s": 1}).json()
    assert slow["timed_out"] is True, slow
    assert time.monotonic() - started < 30
    # the time-out took the command's whole group: nothing of it sleeps on
    left = api.post(f"{one}/exec", json={"command": "ps -eo args | grep -c '^sleep 60'"}).json()
    assert left["stdout"].strip() == "0", left

    streamed = api.post(
        f"{one}/exec", json={"command": "echo out; echo err >&2; exit 5", "stream": True}
    )
    events = [json.loads(line) for line in streamed.iter_lines() if line]
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "started" and kinds[-1] == "exit", events
    by_stream: dict[str, str] = {}
    for event in events:
        if event["kind"] == "output":
            by_stream[event["stream"]] = by_stream.get(event["stream"], "") + event["data"]
    assert by_stream == {"stdout": "out\n", "stderr": "err\n"}, events
    assert events[-1]["exit_code"] == 5, events


def _files(api: httpx.Client, one: str) -> None:
    data = os.urandom(300_000)
    put = api.put(f"{one}/files", params={"path": "/home/user/d/a.bin"}, content=data)
    assert put.status_code == 200, put.text
    assert (put.json()["owner"], put.json()["size"]) == ("1000", len(data)), put.json()
    got = api.get(f"{one}/files", params={"path": "/home/user/d/a.bin"})
    assert got.status_code == 200 and got.content == data
    stat = api.get(f"{one}/files/stat", params={"path": "/home/user/d/a.bin"}).json()
    assert stat["type"] == "file" and stat["size"] == len(data), stat
    # what the API wrote, the sandbox's own programs read
    digest = api.post(f"{one}/exec", json={"command": "sha256sum d/a.bin | cut -c1-64"}).json()
    assert digest["stdout"].strip() == hashlib.sha256(data).hexdigest(), digest

    for n in range(5):
        api.put(f"{one}/files", params={"path": f"/home/user/d/f{n}.txt"}, content=b"x")
    names: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"path": "/home/user/d", "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = api.get(f"{one}/files/list", params=params).json()
        assert len(page["entries"]) <= 2, page
        names += [e["name"] for e in page["entries"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert sorted(names) == ["a.bin", "f0.txt", "f1.txt", "f2.txt", "f3.txt", "f4.txt"], names

    made = api.post(f"{one}/files/mkdir", json={"path": "/home/user/e/f"})
    assert made.status_code == 200 and made.json()["type"] == "dir", made.text
    moved = api.post(
        f"{one}/files/move",
        json={"source": "/home/user/d/a.bin", "destination": "/home/user/e/f/b.bin"},
    )
    assert moved.status_code == 200, moved.text
    assert api.get(f"{one}/files", params={"path": "/home/user/e/f/b.bin"}).content == data
    gone = api.get(f"{one}/files", params={"path": "/home/user/d/a.bin"})
    assert _error(gone) == (404, "path_not_found")
    removed = api.post(f"{one}/files/remove", json={"path": "/home/user/e"})
    assert removed.status_code == 204, removed.text
    assert _error(api.get(f"{one}/files/stat", params={"path": "/home/user/e"})) == (
        404,
        "path_not_found",
    )
    # file calls act as their user: the user may not read root's secrets, root may
    shadow = api.get(f"{one}/files", params={"path": "/etc/shadow"})
    assert _error(shadow) == (403, "permission_denied")
    as_root = api.get(f"{one}/files", params={"path": "/etc/shadow", "user": "root"})
    assert as_root.status_code == 200 and b"root:" in as_root.content
    written = api.put(f"{one}/files", params={"path": "/etc/corral-test"}, content=b"no")
    assert _error(written) == (403, "permission_denied")


def _pause_and_resume(api: httpx.Client, one: str) -> None:
    paused = api.post(f"{one}/pause")
    assert paused.status_code == 200 and paused.json()["state"] == "paused", paused.text
    refused = api.post(f"{one}/exec", json={"cmd": ["true"]})
    assert _error(refused) == (409, "sandbox_not_running")
    resumed = api.post(f"{one}/resume")
    assert resumed.status_code == 200 and resumed.json()["state"] == "running", resumed.text
    assert api.post(f"{one}/exec", json={"cmd": ["true"]}).json()["exit_code"] == 0


@pytest.mark.microvm
@pytest.mark.parametrize("server_options", ["microvm"], indirect=True)
def test_a_fork_of_a_microvm_runs_on_with_the_parents_processes(
    live_server: Callable[..., str], server_options: dict[str, Any]
) -> None:
    """A microVM's snapshot is its whole machine: forks of it run on from that moment, a
    daemon the parent started still beating in each, and each a machine of its own."""
    with _api(live_server, server_options) as api:
        parent = _created(api, "microvm")
        one = f"/v1/sandboxes/{parent['id']}"
        # in a session of its own (the exec's ends with it), beating before the exec ends
        daemon = (
            "setsid sh -c 'while :; do date +%s%N > /tmp/b; mv /tmp/b /tmp/beat; sleep 0.2; done' "
            "</dev/null >/dev/null 2>&1 & while [ ! -s /tmp/beat ]; do sleep 0.05; done"
        )
        assert api.post(f"{one}/exec", json={"command": daemon}).json()["exit_code"] == 0
        forked = api.post(f"{one}/fork", json={"count": 2})
        assert forked.status_code == 201, forked.text
        children = [c["id"] for c in forked.json()["sandboxes"]]
        assert len(children) == 2
        try:
            beats = "cat /tmp/beat; sleep 1; cat /tmp/beat; hostname"
            for child in children:
                ran = api.post(f"/v1/sandboxes/{child}/exec", json={"command": beats}).json()
                assert len(ran["stdout"].split()) == 3, ran
                first, second, hostname = ran["stdout"].split()
                assert int(second) > int(first), ran  # the parent's daemon runs on here
                assert hostname == child
            # the parent goes on too
            assert api.post(f"{one}/exec", json={"cmd": ["true"]}).json()["exit_code"] == 0
        finally:
            for sandbox_id in [*children, parent["id"]]:
                api.delete(f"/v1/sandboxes/{sandbox_id}")
        for sandbox_id in children:
            assert stopped_soon(api, {}, sandbox_id)["backend"] == "microvm"
