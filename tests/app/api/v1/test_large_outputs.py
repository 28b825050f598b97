"""Large outputs through the API: answered whole, kept for the blob retention, counted
against the tenant's storage quota, and capped in batch answers. Embedded and cluster.

The ``fake`` runtime's code is a JSON program (``node/fncall/fake.py``); ``repeat`` makes its
output as large as a test needs.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from starlette.testclient import TestClient

from app.db.outputs import INLINE_BYTES, PREVIEW_CHARS
from app.main import create_app
from tests.conftest import ADMIN

Tenant = dict[str, str]
KIB = 1024


@contextmanager
def gateway(
    make_settings: Callable[..., Any], stack: dict[str, Any], **overrides: Any
) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(**stack, **overrides))) as client:
        yield client


def tenant(client: TestClient, **quota: Any) -> dict[str, str]:
    name = f"t-{time.monotonic_ns()}"
    created = client.post("/v1/tenants", json={"name": name, "quota": quota}, headers=ADMIN)
    assert created.status_code == 201, created.text
    return {"Authorization": f"Bearer {created.json()['key']['api_key']}"}


def program(**behaviour: Any) -> dict[str, Any]:
    return {"language": "fake", "code": json.dumps(behaviour)}


def run(client: TestClient, headers: Tenant, **behaviour: Any) -> httpx.Response:
    return client.post("/v1/run", json=program(**behaviour), headers=headers)


def stored(client: TestClient, headers: Tenant, invocation_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/invocations/{invocation_id}", headers=headers)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_a_large_output_is_answered_and_stored_whole_and_listed_as_a_preview(
    make_settings: Callable[..., Any], stack: dict[str, Any]
) -> None:
    line = "0123456789abcdef" * 4 + "\n"
    repeat = 4 * INLINE_BYTES // len(line)  # 256 KiB
    blob = base64.b64encode(bytes(range(256)) * 1024).decode()  # a 256 KiB file
    with gateway(make_settings, stack) as client:
        headers = tenant(client)
        body = program(stdout=line, stderr="warn\n", repeat=repeat, files={"out.bin": blob})
        answer = client.post("/v1/run", json=body | {"fetch_files": ["out.bin"]}, headers=headers)
        assert answer.status_code == 200, answer.text
        data = answer.json()
        assert data["run"]["stdout"] == line * repeat and not data["run"]["stdout_truncated"]
        assert data["run"]["stderr"] == "warn\n" * repeat
        assert data["files"] == {"out.bin": blob}
        assert data["omitted_outputs"] == {}

        again = stored(client, headers, data["invocation_id"])
        assert again["run"]["stdout"] == line * repeat
        assert again["files"] == {"out.bin": blob} and again["omitted_outputs"] == {}

        (listed,) = client.get("/v1/invocations", headers=headers).json()["invocations"]
        assert listed["run"]["stdout"] == (line * repeat)[:PREVIEW_CHARS]
        assert listed["run"]["stdout_truncated"] is True
        assert listed["run"]["stderr"] == "warn\n" * repeat  # small: whole
        assert listed["files"] == {}
        assert listed["omitted_outputs"] == {"run.stdout": "listed", "files/out.bin": "listed"}

        other = tenant(client)
        response = client.get(f"/v1/invocations/{data['invocation_id']}", headers=other)
        assert response.status_code == 404


def test_a_large_output_expires_after_the_blob_retention(
    make_settings: Callable[..., Any], stack: dict[str, Any]
) -> None:
    big = "z" * (INLINE_BYTES + 1)
    settings = {"blob_retention_hours": 1 / 3600, "retention_seconds": 0.2}  # one second
    with gateway(make_settings, stack, **settings) as client:
        headers = tenant(client)
        data = run(client, headers, stdout=big).json()
        assert data["run"]["stdout"] == big  # answered whole, before it expires

        deadline = time.monotonic() + 15
        while (kept := stored(client, headers, data["invocation_id"]))["omitted_outputs"] == {}:
            assert time.monotonic() < deadline, "the blob never expired"
            time.sleep(0.2)
        assert kept["omitted_outputs"] == {"run.stdout": "expired"}
        assert kept["run"]["stdout"] == big[:PREVIEW_CHARS]
        assert kept["run"]["stdout_truncated"] is True
        assert kept["status"] == "succeeded"  # the record itself stays


def test_the_storage_quota_refuses_new_work_until_outputs_expire(
    make_settings: Callable[..., Any], stack: dict[str, Any]
) -> None:
    big = "s" * (KIB * KIB + 1)  # just over the 1 MiB quota
    settings = {"blob_retention_hours": 5 / 3600, "retention_seconds": 0.2}
    with gateway(make_settings, stack, **settings) as client:
        headers = tenant(client, max_storage_mb=1)
        assert run(client, headers, stdout=big).status_code == 200

        # The bytes kept are cached for about a second on the admission path: poll.
        deadline = time.monotonic() + 10
        while (response := run(client, headers, stdout="small")).status_code == 200:
            assert time.monotonic() < deadline, "the storage quota was never enforced"
            time.sleep(0.1)
        assert response.status_code == 429, response.text
        assert response.json()["error"]["code"] == "storage_quota_exhausted"
        assert int(response.headers["Retry-After"]) >= 1

        other = tenant(client, max_storage_mb=1)
        assert run(client, other, stdout="small").status_code == 200  # per tenant

        deadline = time.monotonic() + 20  # five seconds on, the output has expired
        while (response := run(client, headers, stdout="small")).status_code == 429:
            assert time.monotonic() < deadline, "the quota was never given back"
            time.sleep(0.2)
        assert response.status_code == 200, response.text


def test_a_batch_answer_includes_large_outputs_up_to_its_cap(
    make_settings: Callable[..., Any], stack: dict[str, Any]
) -> None:
    size = 200 * KIB
    outputs = [chr(ord("a") + n) * size for n in range(4)]
    with gateway(make_settings, stack, max_batch_response_bytes=450 * KIB) as client:
        headers = tenant(client)
        body = {"runs": [program(stdout=text) for text in outputs]}
        response = client.post("/v1/run/batch", json=body, headers=headers)
        assert response.status_code == 200, response.text
        items = [item["result"] for item in response.json()["results"]]

        whole = [i for i, item in enumerate(items) if item["omitted_outputs"] == {}]
        elided = [i for i, item in enumerate(items) if item["omitted_outputs"]]
        assert len(whole) == 2 and len(elided) == 2  # 2 x 200 KiB fit in 450 KiB
        for i in whole:
            assert items[i]["run"]["stdout"] == outputs[i]
        for i in elided:
            assert items[i]["omitted_outputs"] == {"run.stdout": "batch_response_cap"}
            assert items[i]["run"]["stdout"] == outputs[i][:PREVIEW_CHARS]
            assert items[i]["run"]["stdout_truncated"] is True
            # Nothing is lost: the record has it whole.
            assert stored(client, headers, items[i]["invocation_id"])["run"]["stdout"] == outputs[i]
