"""The console's function pages over HTTP, against a real nsjail node: a tenant registers
a function and a new version from the page, reads its versions, invokes a chosen version
with a JSON input and sees its output; bad input is shown, not a 500; another tenant
finds nothing; the operator reads every tenant's functions and cannot invoke them."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.app.api.console.test_console import sign_in
from tests.app.api.v1.test_functions import _module
from tests.app.api.v1.test_functions_run import _client
from tests.conftest import ADMIN, ADMIN_KEY

pytestmark = pytest.mark.nsjail

V1 = "def handler(input):\n    return {'sum': sum(input['xs'])}\n"
V2 = "def handler(input):\n    return {'sum': sum(input['xs']), 'version': 2}\n"
SCHEMA = {
    "type": "object",
    "properties": {"xs": {"type": "array", "items": {"type": "integer"}}},
    "required": ["xs"],
}


@pytest.fixture(scope="module")
def jail_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    yield from _client(tmp_path_factory.mktemp("console-fn"), ["nsjail"])


def tenant(client: TestClient) -> dict[str, Any]:
    body = {"name": "fn-" + secrets.token_hex(4), "quota": {}}
    made = client.post("/v1/tenants", json=body, headers=ADMIN)
    assert made.status_code == 201, made.text
    data = made.json()
    return {
        "id": data["tenant"]["id"],
        "name": data["tenant"]["name"],
        "key": data["key"]["api_key"],
    }


def register(client: TestClient, csrf: str, **fields: Any) -> Any:
    form = {
        "csrf": csrf,
        "name": "summer",
        "language": "python",
        "entry_point": "handler",
        "code": V1,
        "input_schema": json.dumps(SCHEMA),
        "timeout_s": "",
        "memory_mb": "",
    } | fields
    return client.post("/console/functions", data=form, follow_redirects=False)


def invoke(client: TestClient, csrf: str, value: str, version: str = "latest") -> Any:
    return client.post(
        "/console/functions/summer/invoke",
        data={"csrf": csrf, "input": value, "version": version},
    )


def output_of(page: str) -> Any:
    start = page.index('<pre id="invoke-output">') + len('<pre id="invoke-output">')
    text = page[start : page.index("</pre>", start)]
    return json.loads(text.replace("&#34;", '"').replace("&quot;", '"'))


def test_a_tenant_registers_and_invokes_a_function_from_the_page(
    jail_client: TestClient,
) -> None:
    client = jail_client
    mine = tenant(client)
    csrf = sign_in(client, mine["key"])
    made = register(client, csrf)
    assert made.status_code == 303 and made.headers["location"] == "/console/functions/summer"
    again = register(client, csrf, code=V2, timeout_s="5")
    assert again.status_code == 303
    listing = client.get("/console/functions")
    assert listing.status_code == 200 and "summer" in listing.text and "latest→2" in listing.text
    detail = client.get("/console/functions/summer")
    assert detail.status_code == 200
    assert detail.text.count("<tr><td>") == 2  # both versions listed
    assert "timeout_s 5.0" in detail.text

    latest = invoke(client, csrf, '{"xs": [1, 2, 39]}')
    assert latest.status_code == 200, latest.text
    assert output_of(latest.text) == {"sum": 42, "version": 2}
    assert 'class="status succeeded"' in latest.text
    first = invoke(client, csrf, '{"xs": [2, 3]}', version="1")
    assert output_of(first.text) == {"sum": 5}
    # the call is in the API's record, as the tenant's
    invocation_id = first.text.split('href="/console/invocations/')[1].split('"')[0]
    recorded = client.get(
        f"/v1/invocations/{invocation_id}", headers={"Authorization": f"Bearer {mine['key']}"}
    )
    assert recorded.status_code == 200 and recorded.json()["status"] == "succeeded"
    # its page says which function and version ran, on what input, and when
    shown = client.get(f"/console/invocations/{invocation_id}").text
    assert '<dd id="function">summer v1</dd>' in shown
    assert '<pre id="input">{\n  &#34;xs&#34;: [\n    2,\n    3\n  ]\n}</pre>' in shown
    assert 'id="created"' in shown and 'id="finished"' in shown
    listed = client.get("/console/invocations", params={"kind": "function"}).text
    assert (
        '<td class="name" title="summer v1">summer v1</td>' in listed
        and '<td class="name" title="summer v2">summer v2</td>' in listed
    )

    # input the schema refuses, input that is not JSON: said on the page, nothing run
    refused = invoke(client, csrf, '{"xs": ["a"]}')
    assert refused.status_code == 200 and 'role="alert"' in refused.text
    assert "invoke-output" not in refused.text
    broken = invoke(client, csrf, "{nope")
    assert "the input is not JSON" in broken.text

    # another tenant sees nothing of it
    client.cookies.clear()
    other_csrf = sign_in(client, tenant(client)["key"])
    assert "summer" not in client.get("/console/functions").text
    assert client.get("/console/functions/summer").status_code == 404
    assert "no function" in invoke(client, other_csrf, '{"xs": []}').text

    # the operator reads every tenant's, read-only
    client.cookies.clear()
    sign_in(client, ADMIN_KEY)
    everyone = client.get("/console/functions")
    assert "summer" in everyone.text and mine["id"] in everyone.text
    # invocations by the tenant's name, not its id; filtered by it
    mine_only = client.get("/console/invocations", params={"tenant": mine["name"]}).text
    assert f'title="{mine["id"]}">{mine["name"]}</td>' in mine_only
    assert mine_only.count('<tr><td class="id"') >= 2
    assert "no tenant named" in client.get("/console/invocations", params={"tenant": "nope"}).text
    assert (
        f'<dd id="tenant" title="{mine["id"]}">{mine["name"]}</dd>'
        in client.get(f"/console/invocations/{invocation_id}").text
    )
    looked = client.get("/console/functions/summer", params={"tenant": mine["id"]})
    assert looked.status_code == 200 and 'id="invoke"' not in looked.text
    assert client.get("/console/functions/summer").status_code == 404  # no tenant named


def test_bad_registrations_are_shown_on_the_page(jail_client: TestClient, tmp_path: Path) -> None:
    client = jail_client
    csrf = sign_in(client, tenant(client)["key"])
    schema = register(client, csrf, input_schema="{not json")
    assert schema.status_code == 200 and "the input schema is not JSON" in schema.text
    assert "{not json" in schema.text  # the form keeps what was typed
    name = register(client, csrf, name="no spaces allowed")
    assert name.status_code == 200 and 'role="alert"' in name.text
    module = _module([])
    both = client.post(
        "/console/functions",
        data={"csrf": csrf, "name": "mod", "language": "wasm", "code": "x", "input_schema": ""}
        | {"entry_point": "", "timeout_s": "", "memory_mb": ""},
        files={"module": ("m.wasm", module, "application/wasm")},
    )
    assert "not both" in both.text
    uploaded = client.post(
        "/console/functions",
        data={"csrf": csrf, "name": "mod", "language": "wasm", "code": "", "input_schema": ""}
        | {"entry_point": "", "timeout_s": "", "memory_mb": ""},
        files={"module": ("m.wasm", module, "application/wasm")},
        follow_redirects=False,
    )
    assert uploaded.status_code == 303, uploaded.text
    detail = client.get("/console/functions/mod")
    assert hashlib.sha256(module).hexdigest()[:12] in detail.text
    assert client.get("/console/functions", params={"page": "x"}).status_code == 200
