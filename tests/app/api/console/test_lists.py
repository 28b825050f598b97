"""The console's lists sorted and filtered on the server: by a whitelisted column (a
header's link), by tenant name, state, image, label, function and time, and continued
page after page by a cursor that neither repeats nor skips a row when rows are added."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.api.console import lists, sorting
from tests.app.api.console.test_console import sign_in
from tests.app.api.v1.test_sandboxes import create, sandbox_client, sandbox_settings
from tests.conftest import ADMIN, ADMIN_KEY

__all__ = ["sandbox_client", "sandbox_settings"]

SANDBOX_ROW = re.compile(r'<td class="id" title="(sbx_[^"]+)"')
INVOCATION_ROW = re.compile(r'<td class="id" title="(inv_[^"]+)"')
FUNCTION_ROW = re.compile(r'<td class="name" title="([^"]+)"><a href="/console/functions/')
NEXT = re.compile(r'<a href="([^"]+)" id="older">')


def tenant(client: TestClient, name: str) -> dict[str, Any]:
    body = {"name": name, "quota": {"max_concurrent_sandboxes": 8}}
    made = client.post("/v1/tenants", json=body, headers=ADMIN).json()
    key = made["key"]["api_key"]
    return {"id": made["tenant"]["id"], "headers": {"Authorization": f"Bearer {key}"}}


def walk(client: TestClient, url: str, row: re.Pattern[str], between: Any = None) -> list[str]:
    """Every row of a list, page after page (``between`` runs after the first page)."""
    seen: list[str] = []
    while True:
        page = client.get(url)
        assert page.status_code == 200 and 'class="error"' not in page.text, page.text
        seen += row.findall(page.text)
        following = NEXT.search(page.text)
        if following is None:
            return seen
        if between is not None:
            between()
            between = None
        url = following.group(1).replace("&amp;", "&")


def test_sandboxes_by_tenant_name_state_and_label_page_by_page(
    sandbox_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lists, "PAGE", 2)
    client = sandbox_client
    zulu, alpha = tenant(client, "zulu-team"), tenant(client, "alpha-team")
    made: dict[str, list[str]] = {"zulu": [], "alpha": []}
    for i in range(3):
        for name, who in (("zulu", zulu), ("alpha", alpha)):
            sbx = create(client, who["headers"], metadata={"episode": str(i)})
            made[name].append(sbx["id"])
    client.delete(f"/v1/sandboxes/{made['alpha'][0]}", headers=alpha["headers"])
    sign_in(client, ADMIN_KEY)

    # newest first by default; by tenant name, A to Z, each tenant's newest... by id
    newest = walk(client, "/console/sandboxes?state=any", SANDBOX_ROW)
    assert newest == [made[n][i] for i in (2, 1, 0) for n in ("alpha", "zulu")]
    by_tenant = walk(client, "/console/sandboxes?state=any&sort=tenant", SANDBOX_ROW)
    assert by_tenant == sorted(made["alpha"]) + sorted(made["zulu"])
    backwards = walk(client, "/console/sandboxes?state=any&sort=-tenant", SANDBOX_ROW)
    assert backwards == by_tenant[::-1]
    # a row made while paging sorts before the cursor: no row repeats, none is skipped
    late: list[str] = []

    def another() -> None:
        late.append(create(client, zulu["headers"])["id"])

    paged = walk(client, "/console/sandboxes?state=any&sort=created", SANDBOX_ROW, another)
    assert paged == [made[n][i] for i in (0, 1, 2) for n in ("zulu", "alpha")] + late

    assert walk(client, "/console/sandboxes?tenant=alpha-team", SANDBOX_ROW) == [
        made["alpha"][2],
        made["alpha"][1],
    ]  # live only: the first is stopping or stopped
    labelled = walk(client, "/console/sandboxes?state=any&label=episode%3D1", SANDBOX_ROW)
    assert sorted(labelled) == sorted([made["alpha"][1], made["zulu"][1]])
    page = client.get("/console/sandboxes?sort=tenant")
    toggle = 'href="/console/sandboxes?state=live&amp;sort=-tenant"'
    assert f'aria-sort="ascending"><a class="sort" {toggle}' in page.text
    unknown = client.get("/console/sandboxes?tenant=nobody")
    assert "no tenant named" in unknown.text and not SANDBOX_ROW.findall(unknown.text)

    # a tenant sees its own only, and cannot sort by tenant (the default order instead)
    client.cookies.clear()
    key = alpha["headers"]["Authorization"].removeprefix("Bearer ")
    sign_in(client, key)
    own = walk(client, "/console/sandboxes?state=any&sort=tenant", SANDBOX_ROW)
    assert own == made["alpha"][::-1]


def test_invocations_by_status_function_time_and_tenant(
    sandbox_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lists, "PAGE", 2)
    client = sandbox_client
    one, two = tenant(client, "one-team"), tenant(client, "two-team")

    def run(who: dict[str, Any], **program: Any) -> dict[str, Any]:
        body = {"language": "fake", "code": json.dumps(program)}
        answer = client.post("/v1/run", json=body, headers=who["headers"])
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    ok = [run(one) for _ in range(3)]
    bad = run(one, exit=1)
    theirs = run(two)
    sign_in(client, ADMIN_KEY)
    mine = walk(client, "/console/invocations?tenant=one-team", INVOCATION_ROW)
    assert mine == [r["invocation_id"] for r in [*ok, bad][::-1]]
    failed = walk(client, "/console/invocations?tenant=one-team&status=failed", INVOCATION_ROW)
    assert failed == [bad["invocation_id"]]
    by_status = walk(client, "/console/invocations?sort=status", INVOCATION_ROW)
    assert by_status[0] == bad["invocation_id"] and len(by_status) == 5  # failed < succeeded
    by_tenant = walk(client, "/console/invocations?sort=-tenant", INVOCATION_ROW)
    assert by_tenant[0] == theirs["invocation_id"]
    since = ok[1]["created_at"]
    before = bad["created_at"]
    window = walk(
        client,
        f"/console/invocations?tenant=one-team&since={since}&before={before}".replace("+", "%2B"),
        INVOCATION_ROW,
    )
    assert window == [ok[2]["invocation_id"], ok[1]["invocation_id"]]
    refused = client.get("/console/invocations?since=yesterday")
    assert "is not a time" in refused.text and not INVOCATION_ROW.findall(refused.text)
    forged = client.get("/console/invocations?cursor=not-a-cursor")
    assert forged.status_code == 200 and "cursor" in forged.text
    # a cursor of one order given to another (a time to a text column, a number to a time)
    timed = NEXT.search(client.get("/console/invocations").text)
    assert timed is not None
    cursor = timed.group(1).split("cursor=")[1]
    crossed = client.get(f"/console/invocations?sort=status&cursor={cursor}")
    assert crossed.status_code == 200 and "cursor" in crossed.text
    numbered = sorting.encode(7, "inv_x")
    assert "cursor" in client.get(f"/console/invocations?cursor={numbered}").text
    # a column that is not on the list is not sorted by
    odd = walk(client, "/console/invocations?sort=secret_hash", INVOCATION_ROW)
    assert odd == walk(client, "/console/invocations", INVOCATION_ROW)


def test_functions_by_name_language_and_tenant(
    sandbox_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lists, "PAGE", 2)
    client = sandbox_client
    one, two = tenant(client, "fn-one"), tenant(client, "fn-two")
    code = "def handler(input):\n    return input\n"
    for who, name in ((one, "beta"), (one, "alpha"), (two, "gamma"), (one, "alphabet")):
        body = {"name": name, "language": "python", "code": code}
        assert client.post("/v1/functions", json=body, headers=who["headers"]).status_code == 201
    sign_in(client, ADMIN_KEY)
    assert walk(client, "/console/functions", FUNCTION_ROW) == [
        "alpha",
        "alphabet",
        "beta",
        "gamma",
    ]
    assert walk(client, "/console/functions?sort=-name", FUNCTION_ROW) == [
        "gamma",
        "beta",
        "alphabet",
        "alpha",
    ]
    assert walk(client, "/console/functions?name=alpha", FUNCTION_ROW) == ["alpha", "alphabet"]
    assert walk(client, "/console/functions?tenant=fn-two", FUNCTION_ROW) == ["gamma"]
    assert walk(client, "/console/functions?language=nodejs", FUNCTION_ROW) == []
    assert walk(client, "/console/functions?name=%25", FUNCTION_ROW) == []  # no wildcard
