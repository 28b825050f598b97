"""``/v1/sandboxes`` end to end: gateway records and routes, the embedded node runs.

The fake backend covers the API on both deployment shapes (embedded; PostgreSQL and
Redis); real containers (crun) cover it on the embedded default."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from images.store import ImageMeta, ImageStore
from tests.node.sandboxes.conftest import make_rootfs
from wire.sandboxes import SandboxSpec


def add_busybox(images_dir: Path, name: str = "busybox") -> str:
    store = ImageStore(images_dir)
    with store.staging() as rootfs:
        make_rootfs(rootfs)
        return store.add(rootfs, ImageMeta(name=name, source="import", user="user")).digest


@pytest.fixture
def sandbox_settings() -> dict[str, Any]:
    """Settings of the gateway beyond the fake backend (a conftest may override it)."""
    return {}


@pytest.fixture
def sandbox_client(
    make_settings: Callable[..., Settings],
    stack: dict[str, Any],
    tmp_path: Path,
    sandbox_settings: dict[str, Any],
) -> Iterator[TestClient]:
    add_busybox(tmp_path / "data" / "images", "python")
    settings = make_settings(sandbox_backends=["fake"], **sandbox_settings, **stack)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture
def tenant(sandbox_client: TestClient) -> dict[str, Any]:
    from tests.conftest import ADMIN

    body = {"name": "sbx-tenant", "quota": {"max_concurrent_sandboxes": 2}}
    response = sandbox_client.post("/v1/tenants", json=body, headers=ADMIN)
    assert response.status_code == 201, response.text
    key = response.json()["key"]["api_key"]
    return {"headers": {"Authorization": f"Bearer {key}"}, "id": response.json()["tenant"]["id"]}


def create(client: TestClient, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        response = client.post("/v1/sandboxes", json={"backend": "fake", **body}, headers=headers)
        if response.status_code != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # the node's first report is on its way
    assert response.status_code == 201, response.text
    return response.json()


def stopped_soon(client: httpx.Client, headers: dict[str, str], sandbox_id: str) -> dict[str, Any]:
    """The sandbox once its teardown (after a destroy's answer) has been recorded."""
    deadline = time.monotonic() + 10
    while True:
        shown = client.get(f"/v1/sandboxes/{sandbox_id}", headers=headers).json()
        if shown["state"] == "stopped" or time.monotonic() > deadline:
            assert shown["state"] == "stopped", shown
            return dict(shown)
        time.sleep(0.01)


def test_create_use_and_destroy_through_the_api(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    sbx = create(client, headers, env={"GREETING": "hi"}, metadata={"episode": "7"})
    assert (
        sbx["state"] == "running" and sbx["node_id"] and sbx["image_digest"].startswith("sha256:")
    )
    assert sbx["metadata"] == {"episode": "7"} and sbx["timings"]["start_ms"] is not None
    one = f"/v1/sandboxes/{sbx['id']}"
    ran = client.post(f"{one}/exec", json={"cmd": ["env"]}, headers=headers).json()
    assert ran["exit_code"] == 0 and "GREETING=hi" in ran["stdout"]
    put = client.put(
        f"{one}/files", params={"path": "/home/user/x.txt"}, content=b"abc", headers=headers
    )
    assert put.status_code == 200 and put.json()["size"] == 3
    assert (
        client.get(f"{one}/files", params={"path": "/home/user/x.txt"}, headers=headers).content
        == b"abc"
    )
    listed = client.get(f"{one}/files/list", params={"path": "/home/user"}, headers=headers).json()
    assert [e["name"] for e in listed["entries"]] == ["x.txt"]
    missing = client.get(f"{one}/files", params={"path": "/nope"}, headers=headers)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "path_not_found"
    streamed = client.post(
        f"{one}/exec", json={"cmd": ["echo", "a"], "stream": True}, headers=headers
    )
    kinds = [json.loads(line)["kind"] for line in streamed.text.splitlines()]
    assert kinds == ["started", "output", "exit"]
    paused = client.post(f"{one}/pause", headers=headers).json()
    assert paused["state"] == "paused"
    refused = client.post(f"{one}/exec", json={"cmd": ["echo"]}, headers=headers)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "sandbox_not_running"
    assert client.post(f"{one}/resume", headers=headers).json()["state"] == "running"
    gone = client.delete(one, headers=headers).json()
    assert gone["state"] == "stopping" and gone["reason"] == "destroyed"  # acknowledged
    after = client.post(f"{one}/exec", json={"cmd": ["echo"]}, headers=headers)
    assert after.status_code == 409
    stopped = stopped_soon(client, headers, sbx["id"])
    assert stopped["reason"] == "destroyed" and stopped["ended_at"]


def test_exec_answers_text_and_the_exact_bytes_where_text_would_not_carry_them(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    one = f"/v1/sandboxes/{create(client, headers)['id']}"
    noise = b"\xff\xfe\x00" + os.urandom(4096)
    for name, data in (("noise", noise), ("text", "café €\n".encode())):
        path = f"/home/user/{name}"
        put = client.put(f"{one}/files", params={"path": path}, content=data, headers=headers)
        assert put.status_code == 200, put.text

    def run(name: str, **body: Any) -> dict[str, Any]:
        ran = client.post(f"{one}/exec", json={"cmd": ["cat", name], **body}, headers=headers)
        assert ran.status_code == 200, ran.text
        return dict(ran.json())

    binary = run("noise")
    assert base64.b64decode(binary["stdout_b64"]) == noise
    assert binary["stdout"] == noise.decode(errors="replace")
    text = run("text")
    assert text["stdout"] == "café €\n" and text["stdout_b64"] is None
    assert base64.b64decode(run("text", binary=True)["stdout_b64"]) == "café €\n".encode()
    streamed = client.post(
        f"{one}/exec", json={"cmd": ["cat", "noise"], "stream": True}, headers=headers
    )
    events = [json.loads(line) for line in streamed.text.splitlines()]
    output = [e for e in events if e["kind"] == "output"]
    assert b"".join(base64.b64decode(e["data_b64"]) for e in output) == noise


def test_the_quota_of_live_sandboxes_holds(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    first, _second = create(client, headers), create(client, headers)
    third = client.post("/v1/sandboxes", json={"backend": "fake"}, headers=headers)
    assert third.status_code == 429 and third.json()["error"]["code"] == "concurrency_limited"
    client.delete(f"/v1/sandboxes/{first['id']}", headers=headers)
    create(client, headers)  # a place is free again
    live = client.get("/v1/sandboxes", headers=headers).json()["sandboxes"]
    assert len(live) == 2


def test_another_tenant_cannot_see_or_touch_a_sandbox(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    from tests.conftest import ADMIN

    client = sandbox_client
    sbx = create(client, tenant["headers"])
    other = client.post("/v1/tenants", json={"name": "intruder"}, headers=ADMIN).json()
    intruder = {"Authorization": f"Bearer {other['key']['api_key']}"}
    one = f"/v1/sandboxes/{sbx['id']}"
    for method, path, kw in (
        ("GET", one, {}),
        ("DELETE", one, {}),
        ("POST", f"{one}/exec", {"json": {"cmd": ["echo"]}}),
        ("GET", f"{one}/files", {"params": {"path": "/etc/passwd"}}),
        ("POST", f"{one}/pause", {}),
    ):
        response = client.request(method, path, headers=intruder, **kw)
        assert response.status_code == 404, (method, path, response.text)
    assert client.get("/v1/sandboxes", headers=intruder).json()["sandboxes"] == []
    assert client.get(one, headers=tenant["headers"]).json()["state"] == "running"


def test_bad_requests_get_clear_4xx(sandbox_client: TestClient, tenant: dict[str, Any]) -> None:
    client, headers = sandbox_client, tenant["headers"]
    for body in ({"memory_mb": 1}, {"image": "../etc"}, {"env": {"1BAD": "x"}}, {"bogus": 1}):
        response = client.post("/v1/sandboxes", json={"backend": "fake", **body}, headers=headers)
        assert response.status_code == 422, (body, response.text)
    sbx = create(client, headers)  # the node is in the catalogue from here on
    no_image = client.post(
        "/v1/sandboxes", json={"backend": "fake", "image": "nope"}, headers=headers
    )
    assert no_image.status_code == 404 and no_image.json()["error"]["code"] == "image_not_found"
    both = client.post(
        f"/v1/sandboxes/{sbx['id']}/exec", json={"cmd": ["a"], "command": "b"}, headers=headers
    )
    assert both.status_code == 422
    root = client.post(
        f"/v1/sandboxes/{sbx['id']}/files/remove", json={"path": "/"}, headers=headers
    )
    assert root.status_code == 400


def test_snapshot_create_from_it_and_fork(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    from tests.conftest import ADMIN

    client, headers = sandbox_client, tenant["headers"]
    patched = client.patch(
        f"/v1/tenants/{tenant['id']}",
        json={"quota": {"max_concurrent_sandboxes": 8}},
        headers=ADMIN,
    )
    assert patched.status_code == 200, patched.text
    sbx = create(client, headers, metadata={"episode": "3"})
    one = f"/v1/sandboxes/{sbx['id']}"
    client.put(
        f"{one}/files", params={"path": "/home/user/step.txt"}, content=b"step 5", headers=headers
    )
    snap = client.post(f"{one}/snapshot", headers=headers)
    assert snap.status_code == 201, snap.text
    snap_id = snap.json()["id"]
    assert snap.json()["node_id"] == sbx["node_id"] and snap.json()["size_bytes"] == 6
    again = create(client, headers, snapshot_id=snap_id)
    got = client.get(
        f"/v1/sandboxes/{again['id']}/files",
        params={"path": "/home/user/step.txt"},
        headers=headers,
    )
    assert got.content == b"step 5"
    forked = client.post(f"{one}/fork", json={"count": 3}, headers=headers)
    assert forked.status_code == 201, forked.text
    branches = forked.json()["sandboxes"]
    assert len(branches) == 3 and len({b["id"] for b in branches}) == 3
    for branch in branches:
        assert branch["metadata"] == {"episode": "3", "forked_from": sbx["id"]}
        text = client.post(
            f"/v1/sandboxes/{branch['id']}/exec",
            json={"cmd": ["cat", "/home/user/step.txt"]},
            headers=headers,
        ).json()
        assert text["stdout"] == "step 5"
    in_use = client.delete(f"/v1/snapshots/{snap_id}", headers=headers)
    assert in_use.status_code == 409
    listed = client.get("/v1/snapshots", headers=headers).json()["snapshots"]
    assert {s["id"] for s in listed} == {snap_id, forked.json()["snapshot"]["id"]}
    client.delete(f"/v1/sandboxes/{again['id']}", headers=headers)
    assert client.delete(f"/v1/snapshots/{snap_id}", headers=headers).status_code == 204
    assert (
        client.post("/v1/sandboxes", json={"snapshot_id": snap_id}, headers=headers).status_code
        == 404
    )


def test_a_snapshot_is_the_tenants_own(sandbox_client: TestClient, tenant: dict[str, Any]) -> None:
    from tests.conftest import ADMIN

    client = sandbox_client
    sbx = create(client, tenant["headers"])
    snap_id = client.post(f"/v1/sandboxes/{sbx['id']}/snapshot", headers=tenant["headers"]).json()[
        "id"
    ]
    other = client.post("/v1/tenants", json={"name": "snap-thief"}, headers=ADMIN).json()
    thief = {"Authorization": f"Bearer {other['key']['api_key']}"}
    stolen = client.post(
        "/v1/sandboxes", json={"backend": "fake", "snapshot_id": snap_id}, headers=thief
    )
    assert stolen.status_code == 404
    assert client.delete(f"/v1/snapshots/{snap_id}", headers=thief).status_code == 404
    assert client.get("/v1/snapshots", headers=thief).json()["snapshots"] == []


def test_a_streamed_exec_that_is_refused_is_an_error_answer(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    """The node refuses before the first event: a 409, not a 200 stream cut short."""
    client, headers = sandbox_client, tenant["headers"]
    one = f"/v1/sandboxes/{create(client, headers)['id']}"
    client.post(f"{one}/pause", headers=headers)
    refused = client.post(f"{one}/exec", json={"cmd": ["echo"], "stream": True}, headers=headers)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "sandbox_not_running"


def _lifetime(client: TestClient, tenant: dict[str, Any], seconds: int) -> None:
    from tests.conftest import ADMIN

    quota = {"max_sandbox_lifetime_seconds": seconds, "max_concurrent_sandboxes": 8}
    patched = client.patch(f"/v1/tenants/{tenant['id']}", json={"quota": quota}, headers=ADMIN)
    assert patched.status_code == 200, patched.text


def _refused_as_too_long(response: Any, limit: int) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "lifetime_too_long"
    assert error["details"]["max_sandbox_lifetime_seconds"] == limit


def _lifespan(sbx: dict[str, Any]) -> float:
    from datetime import datetime

    ends = datetime.fromisoformat(sbx["expires_at"])
    return (ends - datetime.fromisoformat(sbx["created_at"])).total_seconds()


def test_a_create_may_not_outlive_the_lifetime_quota(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    _lifetime(client, tenant, 120)
    asked = client.post("/v1/sandboxes", json={"backend": "fake", "ttl_s": 121}, headers=headers)
    _refused_as_too_long(asked, 120)
    assert client.get("/v1/sandboxes", headers=headers).json()["sandboxes"] == []
    unasked = create(client, headers)  # the default TTL (300) is cut to the limit
    assert _lifespan(unasked) < 300
    snap = client.post(f"/v1/sandboxes/{unasked['id']}/snapshot", headers=headers).json()
    from_snapshot = client.post(
        "/v1/sandboxes", json={"snapshot_id": snap["id"], "ttl_s": 600}, headers=headers
    )
    _refused_as_too_long(from_snapshot, 120)

    shorter = client.post(
        f"/v1/sandboxes/{unasked['id']}/timeout", json={"ttl_s": 30}, headers=headers
    )
    assert shorter.status_code == 200 and _lifespan(shorter.json()) < _lifespan(unasked)

    _lifetime(client, tenant, 3600)  # raised: the same requests now pass
    assert _lifespan(create(client, headers, ttl_s=600)) > 590
    assert create(client, headers, snapshot_id=snap["id"], ttl_s=600)["state"] == "running"


@pytest.mark.parametrize("action", ["timeout", "fork"])
def test_an_extension_past_the_lifetime_is_refused_until_the_quota_is_raised(
    sandbox_client: TestClient, tenant: dict[str, Any], action: str
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    _lifetime(client, tenant, 120)
    one = f"/v1/sandboxes/{create(client, headers, ttl_s=60)['id']}"
    _refused_as_too_long(client.post(f"{one}/{action}", json={"ttl_s": 600}, headers=headers), 120)
    assert client.get("/v1/snapshots", headers=headers).json()["snapshots"] == []  # none made
    assert _lifespan(client.get(one, headers=headers).json()) < 120  # nor extended

    _lifetime(client, tenant, 3600)
    made = client.post(f"{one}/{action}", json={"ttl_s": 600}, headers=headers)
    assert made.status_code in (200, 201), made.text
    extended = made.json() if action == "timeout" else made.json()["sandboxes"][0]
    assert _lifespan(extended) > 590


def _ids(client: TestClient, headers: dict[str, str], **params: Any) -> list[str]:
    response = client.get("/v1/sandboxes", params=params, headers=headers)
    assert response.status_code == 200, response.text
    return [s["id"] for s in response.json()["sandboxes"]]


def test_the_list_filters_on_state_backend_image_and_metadata(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    """In SQL, on SQLite and PostgreSQL: keys with quotes, dots and non-ASCII letters too."""
    client, headers = sandbox_client, tenant["headers"]
    _lifetime(client, tenant, 3600)
    odd = {'a"b': "q", "x.y": "dot", "é": "ü", "n": "7"}
    first = create(client, headers, metadata={"episode": "7", "split": "train"} | odd)["id"]
    second = create(client, headers, metadata={"episode": "8", "split": "train"})["id"]
    third = create(client, headers)["id"]
    assert _ids(client, headers) == [third, second, first]  # newest first
    assert _ids(client, headers, **{"metadata.split": "train"}) == [second, first]
    both = {"metadata.split": "train", "metadata.episode": "8"}
    assert _ids(client, headers, **both) == [second]
    assert _ids(client, headers, **{"metadata.split": "train", "metadata.episode": "9"}) == []
    for key, value in odd.items():
        assert _ids(client, headers, **{f"metadata.{key}": value}) == [first], key
    assert _ids(client, headers, **{"metadata.n": "07"}) == []  # strings, compared exactly
    assert _ids(client, headers, backend="fake", image="python") == [third, second, first]
    assert _ids(client, headers, backend="crun") == []
    assert _ids(client, headers, image="busybox") == []
    client.delete(f"/v1/sandboxes/{second}", headers=headers)
    assert _ids(client, headers) == [third, first]
    assert _ids(client, headers, state="stopped", **{"metadata.episode": "8"}) == [second]
    assert _ids(client, headers, state="running", **{"metadata.episode": "8"}) == []


def test_the_list_is_paged_by_cursor(sandbox_client: TestClient, tenant: dict[str, Any]) -> None:
    client, headers = sandbox_client, tenant["headers"]
    _lifetime(client, tenant, 3600)
    made = [create(client, headers)["id"] for _ in range(3)]
    seen: list[str] = []
    params: dict[str, Any] = {"limit": 2}
    for _ in range(3):
        page = client.get("/v1/sandboxes", params=params, headers=headers).json()
        seen += [s["id"] for s in page["sandboxes"]]
        if page["next_cursor"] is None:
            break
        params["cursor"] = page["next_cursor"]
    assert seen == made[::-1]


def node_spec(client: TestClient, sandbox_id: str) -> SandboxSpec:
    """The spec the embedded node's fake backend was given."""
    backend = client.app.state.services.node.sandboxes.backends["fake"]  # type: ignore[attr-defined]
    spec: SandboxSpec = backend.sandboxes[sandbox_id].spec
    return spec


def test_the_node_is_sent_the_digest_of_the_image_name(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    sbx = create(client, headers, image="python")
    assert sbx["image"] == "python" and sbx["image_digest"].startswith("sha256:")
    assert node_spec(client, sbx["id"]).image == sbx["image_digest"]
    by_prefix = create(client, headers, image=sbx["image_digest"][:16])
    assert node_spec(client, by_prefix["id"]).image == sbx["image_digest"]


def test_an_image_only_the_node_knows_is_sent_by_name(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """The control plane's store lacks it: the node resolves the name (built on it)."""
    from tests.conftest import ADMIN, node_settings

    add_busybox(tmp_path / "data" / "images", "local")  # the node's store
    node = node_settings(tmp_path / "data", sandbox_backends=["fake"])
    settings = make_settings(node=node, images_dir=tmp_path / "gateway-images")
    with TestClient(create_app(settings)) as client:
        made = client.post("/v1/tenants", json={"name": "local-images"}, headers=ADMIN).json()
        headers = {"Authorization": f"Bearer {made['key']['api_key']}"}
        sbx = create(client, headers, image="local")
        assert node_spec(client, sbx["id"]).image == "local"
        assert sbx["image_digest"].startswith("sha256:")


@pytest.mark.parametrize("backend", ["fake", pytest.param("crun", marks=pytest.mark.crun)])
def test_a_node_fetches_an_image_it_lacks_from_the_control_plane(
    live_server: Callable[..., str], tmp_path: Path, backend: str
) -> None:
    """Real HTTP both ways: the gateway sends the digest of ``base`` (its store only), the
    node (its own store, ``control_url`` the gateway) fetches it and creates from it."""
    import httpx
    from pydantic import SecretStr

    from tests.conftest import ADMIN, free_port, node_settings

    digest = add_busybox(tmp_path / "gateway-images", "base")
    port = free_port()
    node = node_settings(
        tmp_path / "data",
        sandbox_backends=[backend],
        node_token=SecretStr("t" * 32),
        images_dir=tmp_path / "node-images",
        control_url=f"http://127.0.0.1:{port}",
    )
    url = live_server(port=port, node=node, images_dir=tmp_path / "gateway-images")
    with httpx.Client(base_url=url, timeout=60) as http:
        made = http.post("/v1/tenants", json={"name": "fetching"}, headers=ADMIN).json()
        headers = {"Authorization": f"Bearer {made['key']['api_key']}"}
        deadline = time.monotonic() + 10
        while True:
            response = http.post(
                "/v1/sandboxes", json={"backend": backend, "image": "base"}, headers=headers
            )
            if response.status_code != 503 or time.monotonic() > deadline:
                break
            time.sleep(0.1)  # the node's first report is on its way
        assert response.status_code == 201, response.text
        sbx = response.json()
        assert (sbx["image"], sbx["image_digest"]) == ("base", digest)
        assert sbx["timings"]["image_ms"] is not None
        one = f"/v1/sandboxes/{sbx['id']}"
        if backend == "crun":  # the fetched tree is the sandbox's root
            ran = http.post(f"{one}/exec", json={"cmd": ["cat", "/etc/secret"]}, headers=headers)
            assert ran.json()["stdout"] == "image-only\n", ran.text
        http.delete(one, headers=headers)
    kept = ImageStore(tmp_path / "node-images")
    assert [(i.digest, i.source) for i in kept.list()] == [(digest, "fetched")]
    assert kept.names() == []
