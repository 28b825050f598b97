"""``/internal/artifacts``: a function's artifact by digest, to nodes holding the node token,
looked up under the tenant the path names."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable

import pytest
from pydantic import SecretStr
from starlette.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from node.artifacts import Artifacts, ArtifactUnavailable, http_source
from tests.conftest import ADMIN
from wire.execution import ARTIFACT_PATH

TOKEN = "node-token-" + "z" * 24
#: a valid module: one function, exported as _start
MODULE = bytes.fromhex(
    "0061736d0100000001040160000003020100070a01065f73746172740000"
) + bytes.fromhex("0a040102000b")


FUNCTION = {
    "name": "m",
    "language": "wasm",
    "module_base64": base64.b64encode(MODULE).decode(),
    "input_schema": {},
}


def tenant(client: TestClient, name: str) -> tuple[str, dict[str, str]]:
    created = client.post("/v1/tenants", json={"name": name}, headers=ADMIN)
    assert created.status_code == 201, created.text
    body = created.json()
    return body["tenant"]["id"], {"Authorization": f"Bearer {body['key']['api_key']}"}


def test_a_node_gets_a_tenants_artifact_and_nothing_of_another(
    make_settings: Callable[..., Settings],
) -> None:
    digest = hashlib.sha256(MODULE).hexdigest()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(create_app(make_settings(node_token=SecretStr(TOKEN)))) as client:
        owner, headers = tenant(client, "owner")
        other, _ = tenant(client, "other")
        registered = client.post(
            "/v1/functions",
            json=FUNCTION,
            headers=headers,
        )
        assert registered.status_code == 201, registered.text
        got = client.get(ARTIFACT_PATH.format(tenant_id=owner, digest=digest), headers=auth)
        assert got.status_code == 200, got.text
        assert got.content == MODULE
        for tenant_id, ref in ((other, digest), (owner, "0" * 64), (owner, digest[:20])):
            missing = client.get(
                ARTIFACT_PATH.format(tenant_id=tenant_id, digest=ref), headers=auth
            )
            assert missing.status_code == 404, (tenant_id, ref)
            assert missing.json()["error"]["code"] == "artifact_not_found"
        # a tenant's own API key is not a node's token
        as_tenant = client.get(
            ARTIFACT_PATH.format(tenant_id=owner, digest=digest), headers=headers
        )
        assert as_tenant.status_code == 403


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({}, 401, "missing_node_token"),
        ({"Authorization": "Bearer wrong"}, 403, "invalid_node_token"),
    ],
)
def test_only_nodes_may_fetch_artifacts(
    make_settings: Callable[..., Settings], headers: dict[str, str], status: int, code: str
) -> None:
    with TestClient(create_app(make_settings(node_token=SecretStr(TOKEN)))) as client:
        response = client.get(ARTIFACT_PATH.format(tenant_id="t", digest="0" * 64), headers=headers)
        assert response.status_code == status
        assert response.json()["error"]["code"] == code


async def test_a_separate_node_fetches_over_http_and_checks_the_bytes(
    live_server: Callable[..., str],
) -> None:
    """The node side (``node.artifacts.http_source``) against a real gateway."""
    import httpx

    url = live_server(node_token=SecretStr(TOKEN))
    digest = hashlib.sha256(MODULE).hexdigest()
    async with httpx.AsyncClient(base_url=url) as http:
        created = await http.post("/v1/tenants", json={"name": "n"}, headers=ADMIN)
        owner = created.json()["tenant"]["id"]
        key = created.json()["key"]["api_key"]
        registered = await http.post(
            "/v1/functions",
            json=FUNCTION,
            headers={"Authorization": f"Bearer {key}"},
        )
        assert registered.status_code == 201, registered.text
    source = http_source(["http://127.0.0.1:1", url], TOKEN)  # the first is down: next
    assert source is not None
    artifacts = Artifacts(source)
    assert await artifacts.get(owner, digest) == MODULE
    with pytest.raises(ArtifactUnavailable, match="HTTP 404"):
        await artifacts.get("ten_other", digest)
    wrong = http_source([url], "not-the-token")
    assert wrong is not None
    with pytest.raises(ArtifactUnavailable, match="HTTP 403"):
        await Artifacts(wrong).get(owner, digest)
