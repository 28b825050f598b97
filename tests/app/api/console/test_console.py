"""The web console over HTTP: signing in leaves only a session cookie; every change needs
the session's CSRF token; a tenant sees only its own; the operator's pages are the
operator's; a revoked key ends its sessions."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from tests.app.api.v1.test_invocations import Tenant, run
from tests.app.api.v1.test_sandboxes import sandbox_client, sandbox_settings, tenant
from tests.conftest import ADMIN_KEY

__all__ = ["sandbox_client", "sandbox_settings", "tenant"]

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def server_sent(client: TestClient, url: str) -> list[tuple[str, Any]]:
    """The events of a stream that ends by itself: (name, data) each."""
    events: list[tuple[str, Any]] = []
    with client.stream("GET", url) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        name = ""
        for line in stream.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, json.loads(line.removeprefix("data: "))))
    return events


def sign_in(client: TestClient, key: str) -> str:
    """Sign in through the form; the session's CSRF token."""
    form = client.get("/console/login")
    token = re.search(r'name="login_token" value="([^"]+)"', form.text)
    assert token is not None, form.text
    answer = client.post(
        "/console/login",
        data={"api_key": key, "login_token": token.group(1), "next": "/console"},
        follow_redirects=False,
    )
    assert answer.status_code == 303, answer.text
    cookie = answer.headers.get("set-cookie", "").lower()
    assert "corral_console=" in cookie and "httponly" in cookie and "samesite=strict" in cookie
    page = client.get("/console")
    assert page.status_code == 200
    found = CSRF.search(page.text)
    assert found is not None
    return found.group(1)


def test_signing_in_keeps_only_a_session_cookie(client: TestClient) -> None:
    assert (
        client.get("/console", follow_redirects=False)
        .headers["location"]
        .startswith("/console/login")
    )
    sign_in(client, ADMIN_KEY)
    cookie = client.cookies.get("corral_console")
    assert cookie and ADMIN_KEY not in cookie
    page = client.get("/console")
    assert ADMIN_KEY not in page.text and "Overview" in page.text
    csrf = CSRF.search(page.text).group(1)  # type: ignore[union-attr]
    client.post("/console/logout", data={"csrf": csrf}, follow_redirects=False)
    assert client.get("/console", follow_redirects=False).status_code == 303  # signed out


def test_a_wrong_key_is_refused_and_a_login_without_its_form_token_too(client: TestClient) -> None:
    form = client.get("/console/login")
    token = re.search(r'name="login_token" value="([^"]+)"', form.text).group(1)  # type: ignore[union-attr]
    wrong = client.post("/console/login", data={"api_key": "nope", "login_token": token})
    assert wrong.status_code == 401 and "not valid" in wrong.text
    client.cookies.clear()
    forged = client.post("/console/login", data={"api_key": ADMIN_KEY, "login_token": "x"})
    assert forged.status_code == 403 and client.cookies.get("corral_console") is None


def test_a_change_without_the_csrf_token_is_refused(client: TestClient) -> None:
    csrf = sign_in(client, ADMIN_KEY)
    refused = client.post("/console/tenants", data={"name": "forged"})
    assert refused.status_code == 403
    wrong = client.post("/console/tenants", data={"name": "forged", "csrf": "x" * len(csrf)})
    assert wrong.status_code == 403
    assert "forged" not in client.get("/console/tenants").text
    made = client.post("/console/tenants", data={"name": "made-here", "csrf": csrf})
    assert made.status_code == 200 and "New API key" in made.text


def test_the_operator_creates_a_tenant_and_changes_its_quota(client: TestClient) -> None:
    csrf = sign_in(client, ADMIN_KEY)
    made = client.post("/console/tenants", data={"name": "quota-t", "csrf": csrf})
    tenant_id = re.search(r"<code>(ten_[^<]+)</code>", made.text).group(1)  # type: ignore[union-attr]
    key = re.search(r'id="new-key">([^<]+)<', made.text).group(1)  # type: ignore[union-attr]
    saved = client.post(
        f"/console/tenants/{tenant_id}",
        data={"csrf": csrf, "quota.max_concurrent_executions": "7"},
        follow_redirects=True,
    )
    assert saved.status_code == 200 and "Saved." in saved.text
    api = client.get(f"/v1/tenants/{tenant_id}", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert api.json()["quota"]["max_concurrent_executions"] == 7
    bad = client.post(
        f"/console/tenants/{tenant_id}", data={"csrf": csrf, "quota.max_memory_mb": "lots"}
    )
    assert bad.status_code == 200 and "validation" in bad.text  # shown on the page, not a 500
    # the key the page showed works on the API
    ran = client.post(
        "/v1/run",
        json={"language": "fake", "code": "{}"},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert ran.status_code == 200


def test_disabling_a_tenant_and_revoking_a_key_ask_first(client: TestClient) -> None:
    """Destructive actions take two steps (newcomer review 3, #43: one click revoked a
    key); enabling again, a harmless change, takes one."""
    csrf = sign_in(client, ADMIN_KEY)
    made = client.post("/console/tenants", data={"name": "careful-t", "csrf": csrf})
    tenant_id = re.search(r"<code>(ten_[^<]+)</code>", made.text).group(1)  # type: ignore[union-attr]
    key_id = re.search(r"/keys/(key_[^/]+)/revoke", made.text).group(1)  # type: ignore[union-attr]
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}

    asked = client.post(f"/console/tenants/{tenant_id}", data={"csrf": csrf, "disabled": "true"})
    assert "Are you sure?" in asked.text and f"Disable the tenant {tenant_id}?" in asked.text
    assert client.get(f"/v1/tenants/{tenant_id}", headers=admin).json()["disabled"] is False
    done = client.post(
        f"/console/tenants/{tenant_id}",
        data={"csrf": csrf, "disabled": "true", "confirmed": "yes"},
        follow_redirects=True,
    )
    assert done.status_code == 200 and "Disabled: its keys are refused." in done.text
    enabled = client.post(
        f"/console/tenants/{tenant_id}",
        data={"csrf": csrf, "disabled": "false"},
        follow_redirects=True,
    )
    assert "Active." in enabled.text  # no question for that

    revoke = f"/console/tenants/{tenant_id}/keys/{key_id}/revoke"
    asked = client.post(revoke, data={"csrf": csrf})
    assert f"Revoke the key {key_id}?" in asked.text
    keys = client.get(f"/v1/tenants/{tenant_id}/keys", headers=admin).json()["keys"]
    assert [k["revoked_at"] for k in keys] == [None]
    client.post(revoke, data={"csrf": csrf, "confirmed": "yes"})
    keys = client.get(f"/v1/tenants/{tenant_id}/keys", headers=admin).json()["keys"]
    assert keys[0]["revoked_at"] is not None


def test_the_operator_deletes_a_tenant_after_choosing_keep_or_purge(client: TestClient) -> None:
    csrf = sign_in(client, ADMIN_KEY)
    made = client.post("/console/tenants", data={"name": "leaving-t", "csrf": csrf})
    tenant_id = re.search(r"<code>(ten_[^<]+)</code>", made.text).group(1)  # type: ignore[union-attr]
    key = re.search(r'id="new-key">([^<]+)<', made.text).group(1)  # type: ignore[union-attr]
    ran = run(client, {"headers": {"Authorization": f"Bearer {key}"}}, stdout="bye")
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert f'href="/console/tenants/{tenant_id}/delete"' in made.text

    choice = client.get(f"/console/tenants/{tenant_id}/delete")
    assert "Delete, keep its records" in choice.text and "Delete and purge its data" in choice.text
    action = f"/console/tenants/{tenant_id}/delete"
    asked = client.post(action, data={"csrf": csrf, "purge": "yes"})  # not from the choice page
    assert "Are you sure?" in asked.text and 'name="purge" value="yes"' in asked.text
    assert client.get(f"/v1/tenants/{tenant_id}", headers=admin).json()["deleted_at"] is None

    kept = client.post(action, data={"csrf": csrf, "purge": "no", "confirmed": "yes"})
    assert kept.status_code == 200 and "is deleted" in kept.text and "records are kept" in kept.text
    shown = client.get(f"/v1/tenants/{tenant_id}", headers=admin).json()
    assert shown["deleted_at"] and shown["purged_at"] is None
    invocation = f"/console/invocations/{ran['invocation_id']}"
    assert client.get(invocation).status_code == 200
    page = client.get(f"/console/tenants/{tenant_id}").text
    assert "Deleted " in page and "Purge its data" in page and ">Enable<" not in page

    purged = client.post(action, data={"csrf": csrf, "purge": "yes", "confirmed": "yes"})
    assert 'id="purged"' in purged.text and "Nothing of its data is left" in purged.text
    assert client.get(f"/v1/tenants/{tenant_id}", headers=admin).json()["purged_at"]
    assert client.get(invocation).status_code == 404
    assert "purged" in client.get("/console/tenants").text


def test_a_tenant_makes_and_revokes_its_own_keys(
    client: TestClient, new_tenant: Callable[..., Tenant]
) -> None:
    tenant = new_tenant()
    csrf = sign_in(client, tenant["key"])
    page = client.get("/console/keys")
    assert page.status_code == 200 and tenant["key_id"] in page.text
    made = client.post("/console/keys", data={"csrf": csrf, "name": "laptop"})
    new_key = re.search(r'id="new-key">([^<]+)<', made.text).group(1)  # type: ignore[union-attr]
    new_id = new_key.split("_")[1] + "_" + new_key.split("_")[2]
    assert "laptop" in made.text and new_id in made.text
    assert client.get("/v1/keys", headers={"Authorization": f"Bearer {new_key}"}).status_code == 200
    asked = client.post(f"/console/keys/{new_id}/revoke", data={"csrf": csrf})
    assert f"Revoke the key {new_id}?" in asked.text  # asked first
    client.post(f"/console/keys/{new_id}/revoke", data={"csrf": csrf, "confirmed": "yes"})
    assert client.get("/v1/keys", headers={"Authorization": f"Bearer {new_key}"}).status_code == 401
    assert client.get("/console/keys").status_code == 200  # signed in with the other key

    client.cookies.clear()
    sign_in(client, ADMIN_KEY)
    assert client.get("/console/keys", follow_redirects=False).headers["location"] == (
        "/console/tenants"
    )
    operator_view = client.get(f"/console/tenants/{tenant['id']}").text
    assert "last used" in operator_view and new_id in operator_view


def test_a_tenant_runs_code_and_sees_only_its_own_invocations(
    client: TestClient, new_tenant: Callable[..., Tenant]
) -> None:
    mine, other = new_tenant("console-mine"), new_tenant("console-other")
    theirs = run(client, other, stdout="secret-of-other")
    csrf = sign_in(client, mine["key"])
    ran = client.post(
        "/console/run",
        data={"csrf": csrf, "language": "fake", "code": json.dumps({"stdout": "from-console"})},
    )
    assert ran.status_code == 200 and "from-console" in ran.text
    listing = client.get("/console/invocations")
    assert "from-console" not in listing.text  # the list shows ids, the detail the output
    assert theirs["invocation_id"] not in listing.text
    assert client.get(f"/console/invocations/{theirs['invocation_id']}").status_code == 404
    assert client.get("/console/tenants").status_code == 403
    filtered = client.get("/console/invocations", params={"status": "failed"})
    assert "nothing yet" in filtered.text
    # a final invocation's live stream says so once and ends; another tenant's is a 404
    invocation_id = ran.url.path.rsplit("/", 1)[1]
    assert 'id="watch"' not in ran.text  # nothing to watch on a final one
    assert server_sent(client, f"/console/invocations/{invocation_id}/live") == [
        ("invocation", {"status": "succeeded", "final": True, "attempts": 1}),
        ("done", {}),
    ]
    gone = client.get(f"/console/invocations/{theirs['invocation_id']}/live")
    assert gone.status_code == 404


def test_a_revoked_key_ends_its_console_sessions(
    client: TestClient, new_tenant: Callable[..., Tenant]
) -> None:
    tenant = new_tenant()
    sign_in(client, tenant["key"])
    assert client.get("/console/invocations").status_code == 200
    revoked = client.delete(
        f"/v1/tenants/{tenant['id']}/keys/{tenant['key_id']}",
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    )
    assert revoked.status_code == 200
    assert client.get("/console/invocations", follow_redirects=False).status_code == 303


def test_the_usage_page_shows_the_apis_figures(
    client: TestClient, new_tenant: Callable[..., Tenant]
) -> None:
    tenant = new_tenant()
    run(client, tenant, cpu_ms=2000)
    sign_in(client, tenant["key"])
    page = client.get("/console/usage", params={"group_by": "day,language"})
    assert page.status_code == 200
    api = client.get(
        "/v1/usage",
        params={"group_by": "day,language", "start": "2000-01-01T00:00:00Z"},
        headers=tenant["headers"],
    ).json()
    assert f"{api['rows'][0]['cost']:.6f}" in page.text
    chart = json.loads(re.search(r'id="chart-data">([^<]+)<', page.text).group(1))  # type: ignore[union-attr]
    assert chart["series"][0]["name"] == "fake"
    bad = client.get("/console/usage", params={"group_by": "colour"})
    assert bad.status_code == 422


def test_the_usage_pages_csv_downloads_with_the_console_session(
    client: TestClient, new_tenant: Callable[..., Tenant]
) -> None:
    """The page's CSV link is the console's own (its cookie is scoped to /console and
    /v1 asks for an API key: the link to /v1/usage answered 401 in a browser)."""
    tenant = new_tenant()
    run(client, tenant, cpu_ms=2000)
    sign_in(client, tenant["key"])
    page = client.get("/console/usage", params={"group_by": "day,language"})
    link = re.search(r'href="([^"]*usage\.csv[^"]*)"', page.text).group(1)  # type: ignore[union-attr]
    assert link.startswith("/console/usage.csv?")
    got = client.get(link.replace("&amp;", "&"))
    assert got.status_code == 200, got.text
    assert got.headers["content-type"].startswith("text/csv")
    assert got.headers["content-disposition"].startswith("attachment;")
    rows = list(csv.DictReader(io.StringIO(got.text)))
    assert [r["language"] for r in rows] == ["fake", ""] and rows[-1]["day"] == "total"
    api = client.get(
        "/v1/usage",
        params={"group_by": "day,language", "start": "2000-01-01T00:00:00Z"},
        headers=tenant["headers"],
    ).json()
    assert float(rows[0]["cost"]) == pytest.approx(api["rows"][0]["cost"])
    client.cookies.clear()
    assert client.get("/console/usage.csv", follow_redirects=False).status_code == 303


def test_the_servers_root_leads_a_browser_to_the_console(client: TestClient) -> None:
    answer = client.get("/", follow_redirects=False)
    assert answer.status_code == 307 and answer.headers["location"] == "/console"


def test_a_next_page_elsewhere_is_not_followed(client: TestClient) -> None:
    form = client.get("/console/login", params={"next": "https://evil.example/"})
    token = re.search(r'name="login_token" value="([^"]+)"', form.text).group(1)  # type: ignore[union-attr]
    answer = client.post(
        "/console/login",
        data={"api_key": ADMIN_KEY, "login_token": token, "next": "//evil.example/"},
        follow_redirects=False,
    )
    assert answer.headers["location"] == "/console"


def test_a_tenant_works_in_a_sandbox_and_the_operator_only_looks(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client = sandbox_client
    key = tenant["headers"]["Authorization"].removeprefix("Bearer ")
    csrf = sign_in(client, key)
    made = client.post(
        "/console/sandboxes",
        data={"csrf": csrf, "image": "python", "backend": "fake", "memory_mb": "256"},
    )
    assert made.status_code == 200, made.text
    sandbox_id = re.search(r"Sandbox <code>(sbx_[^<]+)</code>", made.text).group(1)  # type: ignore[union-attr]
    ran = client.post(
        f"/console/sandboxes/{sandbox_id}/exec", data={"csrf": csrf, "command": "echo 'two words'"}
    )
    assert '<pre id="exec-stdout">two words\n</pre>' in ran.text
    unparsable = client.post(
        f"/console/sandboxes/{sandbox_id}/exec", data={"csrf": csrf, "command": "echo 'open"}
    )
    assert "cannot be parsed" in unparsable.text
    forged = client.post(f"/console/sandboxes/{sandbox_id}/kill", data={"csrf": "nope"})
    assert forged.status_code == 403
    paused = client.post(f"/console/sandboxes/{sandbox_id}/pause", data={"csrf": csrf})
    assert '<dd id="state">paused</dd>' in paused.text
    refused = client.post(
        f"/console/sandboxes/{sandbox_id}/exec", data={"csrf": csrf, "command": "echo no"}
    )
    assert refused.status_code == 200 and "exec-stdout" not in refused.text
    listed = client.get("/console/sandboxes")
    assert sandbox_id in listed.text

    client.cookies.clear()
    admin_csrf = sign_in(client, ADMIN_KEY)
    seen = client.get("/console/sandboxes")
    assert sandbox_id in seen.text and tenant["id"] in seen.text
    detail = client.get(f"/console/sandboxes/{sandbox_id}")
    assert detail.status_code == 200 and "Run a command" not in detail.text
    acted = client.post(
        f"/console/sandboxes/{sandbox_id}/kill", data={"csrf": admin_csrf, "confirmed": "yes"}
    )
    assert acted.status_code == 200 and "tenant" in acted.text  # the tenant's to do

    client.cookies.clear()
    csrf = sign_in(client, key)  # a new session, a new CSRF token
    asked = client.post(f"/console/sandboxes/{sandbox_id}/kill", data={"csrf": csrf})
    assert asked.status_code == 200 and "Are you sure?" in asked.text  # not killed yet
    assert f"Kill the sandbox {sandbox_id}?" in asked.text
    assert '<dd id="state">paused</dd>' in client.get(f"/console/sandboxes/{sandbox_id}").text
    confirmation = dict(re.findall(r'name="([^"]+)" value="([^"]*)"', asked.text))
    assert confirmation == {"csrf": csrf, "confirmed": "yes"}
    killed = client.post(f"/console/sandboxes/{sandbox_id}/kill", data=confirmation)
    assert '<dd id="state">stopped</dd>' in killed.text
    # a stopped sandbox's live stream says so once and ends
    [(name, figures), done] = server_sent(client, f"/console/sandboxes/{sandbox_id}/live")
    assert (name, figures["state"], done) == ("sandbox", "stopped", ("done", {}))
    assert client.get("/console/sandboxes/sbx_nope/live").status_code == 404


def test_a_sandboxs_terminal_is_its_tenants_and_only_from_the_consoles_own_pages(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client = sandbox_client
    csrf = sign_in(client, tenant["headers"]["Authorization"].removeprefix("Bearer "))
    made = client.post(
        "/console/sandboxes",
        data={"csrf": csrf, "image": "python", "backend": "fake", "memory_mb": "256"},
    )
    sandbox_id = re.search(r"Sandbox <code>(sbx_[^<]+)</code>", made.text).group(1)  # type: ignore[union-attr]
    assert 'id="terminal-card"' in made.text
    url = f"/console/sandboxes/{sandbox_id}/terminal?cols=80&rows=24"
    own = {"origin": "http://testserver"}
    with client.websocket_connect(url, headers=own) as ws:
        seen = b""
        ws.send_bytes(b"stty size\r")
        while b"24 80\r\n" not in seen:
            seen += ws.receive_bytes()
        ws.send_text(json.dumps({"type": "resize", "cols": 100, "rows": 30}))
        ws.send_bytes(b"stty size\r")
        while b"30 100\r\n" not in seen:
            seen += ws.receive_bytes()
        ws.send_bytes(b"exit 2\r")
        while True:
            message = ws.receive()
            if message["type"] == "websocket.close":
                break
        assert (message["code"], message["reason"]) == (1000, "exit 2")
    # a page of another site (the browser sends the console's cookie with it), or none
    for headers in ({"origin": "http://evil.example"}, {}):
        with (
            pytest.raises(WebSocketDisconnect) as refused,
            client.websocket_connect(url, headers=headers) as ws,
        ):
            ws.receive()
        assert refused.value.code == 1008
    # the operator sees the page, not the terminal
    client.cookies.clear()
    sign_in(client, ADMIN_KEY)
    assert 'id="terminal-card"' not in client.get(f"/console/sandboxes/{sandbox_id}").text
    with (
        pytest.raises(WebSocketDisconnect) as refused,
        client.websocket_connect(url, headers=own) as ws,
    ):
        ws.receive()
    assert refused.value.code == 1008
