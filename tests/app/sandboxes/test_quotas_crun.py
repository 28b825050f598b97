"""The review's reproductions of unbounded sandboxes, on real containers (crun, the
``python`` image, a real server): a create of 256 GiB, 1 TiB and 64 CPUs, and snapshots
past ``max_storage_mb``."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.app.api.v1.test_sandboxes_crun import python_images_dir
from tests.conftest import ADMIN

pytestmark = [pytest.mark.crun, pytest.mark.slow]
MIB = 1 << 20


@dataclass
class Api:
    client: httpx.Client
    url: str
    tenant_id: str

    def quota(self, **limits: Any) -> None:
        patched = httpx.patch(
            f"{self.url}/v1/tenants/{self.tenant_id}", json={"quota": limits}, headers=ADMIN
        )
        assert patched.status_code == 200, patched.text

    def create(self, **body: Any) -> httpx.Response:
        deadline = time.monotonic() + 20
        while True:
            answer = self.client.post("/v1/sandboxes", json={"image": "python", **body})
            if answer.status_code != 503 or time.monotonic() > deadline:
                return answer
            time.sleep(0.1)  # the node's first report is on its way


@pytest.fixture
def api(live_server: Callable[..., str]) -> Iterator[Api]:
    url = live_server(sandbox_backends=["crun"], images_dir=python_images_dir())
    made = httpx.post(f"{url}/v1/tenants", json={"name": "quotas-crun"}, headers=ADMIN).json()
    headers = {"Authorization": f"Bearer {made['key']['api_key']}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        yield Api(client, url, made["tenant"]["id"])


def _containers(data_dir: Path) -> list[str]:
    state = data_dir / "sandboxes" / ".state"
    if not state.is_dir():
        return []
    listed = subprocess.run(
        ["crun", "--root", str(state), "list", "-q"], capture_output=True, text=True, check=True
    )
    return [c for c in listed.stdout.split() if not c.startswith("warm-")]


def test_a_huge_create_is_refused_and_nothing_is_made(api: Api, tmp_path: Path) -> None:
    huge = {"memory_mb": 262_144, "disk_mb": 1_048_576, "cpu": 64}
    refused = api.create(**huge)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "sandbox_too_large"
    # allowed by the tenant's quota, it is still more than the node gives its sandboxes
    api.quota(
        max_sandbox_memory_mb=262_144,
        max_sandbox_disk_mb=1_048_576,
        max_sandbox_cpu=64,
        max_sandboxes_memory_mb=262_144,
        max_sandboxes_disk_mb=1_048_576,
        max_sandboxes_cpu=64,
    )
    too_large = api.create(**huge)
    assert too_large.status_code == 422, too_large.text
    error = too_large.json()["error"]
    assert error["code"] == "sandbox_too_large" and error["details"]["quota"] is None
    listed = api.client.get("/v1/sandboxes", params={"state": "stopped"})
    assert listed.json()["sandboxes"] == []
    assert api.client.get("/v1/sandboxes").json()["sandboxes"] == []
    assert _containers(tmp_path / "data") == []


def test_snapshots_stop_at_the_storage_quota_before_anything_is_copied(
    api: Api, tmp_path: Path
) -> None:
    api.quota(max_storage_mb=16)
    made = api.create(memory_mb=256)
    assert made.status_code == 201, made.text
    one = f"/v1/sandboxes/{made.json()['id']}"
    copies = tmp_path / "data" / "sandboxes" / ".snapshots"
    sbx = api.client
    try:
        # the review's 40 MiB sandbox: not one snapshot fits in 16 MiB
        filled = sbx.post(
            f"{one}/exec", json={"command": "head -c 41943040 /dev/urandom > /home/user/big"}
        )
        assert filled.json()["exit_code"] == 0, filled.text
        first = sbx.post(f"{one}/snapshot")
        assert first.status_code == 429, first.text
        assert first.json()["error"]["code"] == "storage_quota_exhausted"
        assert not copies.exists() or list(copies.iterdir()) == []
        # 6 MiB of files: two snapshots fit, the third would pass 16 MiB
        shrunk = sbx.post(
            f"{one}/exec",
            json={"command": "rm /home/user/big; head -c 6291456 /dev/urandom > /home/user/f"},
        )
        assert shrunk.json()["exit_code"] == 0, shrunk.text
        answers = [sbx.post(f"{one}/snapshot") for _ in range(3)]
        assert [a.status_code for a in answers] == [201, 201, 429], [a.text for a in answers]
        assert answers[2].json()["error"]["code"] == "storage_quota_exhausted"
        kept = sbx.get("/v1/snapshots").json()["snapshots"]
        assert len(kept) == 2 and all(6 * MIB <= s["size_bytes"] < 8 * MIB for s in kept)
        assert len(list(copies.iterdir())) == 2
    finally:
        for snapshot in sbx.get("/v1/snapshots").json()["snapshots"]:
            sbx.delete(f"/v1/snapshots/{snapshot['id']}")
        sbx.delete(one)
