"""A sandbox's console page: its files (a folder's parent, a file downloaded, a file
uploaded: streamed both ways through the sandbox files API as the signed-in tenant, the
upload with the session's CSRF token in a header and past the body cap) and its CPU per
metered interval."""

from __future__ import annotations

import os
import re
import time
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.app.api.console.test_console import sign_in
from tests.app.api.v1.test_sandboxes import create, sandbox_client, stopped_soon, tenant
from tests.conftest import ADMIN_KEY

__all__ = ["sandbox_client", "tenant"]

#: far below the file: an upload is not a body the cap applies to
BODY_CAP = 4096


@pytest.fixture
def sandbox_settings() -> dict[str, Any]:
    return {"max_body_bytes": BODY_CAP}


def test_files_go_up_and_down_through_the_page(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client = sandbox_client
    key = tenant["headers"]["Authorization"].removeprefix("Bearer ")
    csrf = sign_in(client, key)
    sbx = create(client, tenant["headers"])
    base = f"/console/sandboxes/{sbx['id']}"
    data = os.urandom(64 * 1024)  # sixteen times the body cap
    target = {"path": "/home/user/up.bin"}

    forged = client.put(f"{base}/files", params=target, content=data)
    assert forged.status_code == 403
    wrong = client.put(f"{base}/files", params=target, content=data, headers={"X-CSRF-Token": "x"})
    assert wrong.status_code == 403
    assert "up.bin" not in client.get(base).text  # nothing written

    put = client.put(f"{base}/files", params=target, content=data, headers={"X-CSRF-Token": csrf})
    assert put.status_code == 200, put.text
    assert put.json()["size"] == len(data) and put.json()["path"] == "/home/user/up.bin"
    page = client.get(base).text
    link = f"{base}/files/download?path=/home/user/up.bin"
    assert link in page and 'id="parent"' in page and 'data-upload="' in page
    got = client.get(link)
    assert got.status_code == 200 and got.content == data
    assert got.headers["content-disposition"] == "attachment; filename*=UTF-8''up.bin"
    missing = client.get(f"{base}/files/download", params={"path": "/home/user/nope"})
    assert missing.status_code == 404
    elsewhere = client.put(
        "/console/sandboxes/sbx_nope/files",
        params=target,
        content=b"x",
        headers={"X-CSRF-Token": csrf},
    )
    assert elsewhere.status_code == 404 and elsewhere.json()["error"]["message"]
    up = client.get(base, params={"path": "/home"}).text
    assert f'href="{base}?path=/"' in up  # the parent of /home

    # the operator looks, and cannot put a file in a tenant's sandbox
    client.cookies.clear()
    admin_csrf = sign_in(client, ADMIN_KEY)
    refused = client.put(
        f"{base}/files", params=target, content=b"x", headers={"X-CSRF-Token": admin_csrf}
    )
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "tenant_required"


def test_the_page_shows_the_cpu_of_each_metered_interval(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client = sandbox_client
    key = tenant["headers"]["Authorization"].removeprefix("Bearer ")
    sign_in(client, key)
    sbx = create(client, tenant["headers"])
    running = client.get(f"/console/sandboxes/{sbx['id']}").text
    assert 'id="sandbox-chart"' in running and "No interval metered yet" in running
    time.sleep(0.05)  # an interval of some length
    client.delete(f"/v1/sandboxes/{sbx['id']}", headers=tenant["headers"])
    stopped_soon(client, tenant["headers"], sbx["id"])
    deadline = time.monotonic() + 10
    page = client.get(f"/console/sandboxes/{sbx['id']}").text
    while 'id="metered-data"' not in page and time.monotonic() < deadline:
        time.sleep(0.05)  # metered once it is recorded stopped
        page = client.get(f"/console/sandboxes/{sbx['id']}").text
    rows = re.findall(r"<tr><td>[0-9:]{8}</td><td>([0-9.]+)</td><td>([0-9.]+)</td></tr>", page)
    assert len(rows) == 1 and float(rows[0][0]) > 0, page
    assert 'id="sandbox-chart"' not in page  # nothing to sample any more
