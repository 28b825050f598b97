"""``corral tenant``, ``key`` and ``usage`` against a real server on a free port, through
the SDK: output, and clean errors (the server's, an unreachable server, a proxy's page)."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import pytest

from tests.app.cli.conftest import admin, assert_clean_error, corral

# --- admin commands -----------------------------------------------------------------------


def test_tenant_and_key_commands(server_url: str) -> None:
    created = admin(
        server_url, "tenant", "create", "cli-team", "--quota", "max_concurrent_executions=3"
    )
    assert created.exit_code == 0, created.output
    body = json.loads(created.stdout)
    tenant_id = body["tenant"]["id"]
    assert body["tenant"]["name"] == "cli-team"
    assert body["tenant"]["quota"]["max_concurrent_executions"] == 3
    assert body["key"]["api_key"].startswith("crl_key_")

    listed = admin(server_url, "tenant", "list")
    assert listed.exit_code == 0, listed.output
    assert [t["id"] for t in json.loads(listed.stdout)["tenants"]] == [tenant_id]

    key = admin(server_url, "key", "create", tenant_id, "--name", "ci")
    assert key.exit_code == 0, key.output
    new_key = json.loads(key.stdout)
    assert new_key["name"] == "ci" and new_key["tenant_id"] == tenant_id

    code = json.dumps({"stdout": "with the new key"})
    ran = corral(
        "run", "-l", "fake", "-c", code, CORRAL_URL=server_url, CORRAL_API_KEY=new_key["api_key"]
    )
    assert ran.exit_code == 0, ran.output
    assert ran.stdout == "with the new key"

    revoked = admin(server_url, "key", "revoke", tenant_id, new_key["id"])
    assert revoked.exit_code == 0, revoked.output
    assert json.loads(revoked.stdout)["revoked_at"] is not None

    refused = corral(
        "run", "-l", "fake", "-c", code, CORRAL_URL=server_url, CORRAL_API_KEY=new_key["api_key"]
    )
    assert_clean_error(refused, "401", "invalid_api_key")


def test_tenant_create_errors_are_clean(server_url: str) -> None:
    assert admin(server_url, "tenant", "create", "dup").exit_code == 0
    assert_clean_error(admin(server_url, "tenant", "create", "dup"), "409", "conflict")
    assert_clean_error(
        admin(server_url, "tenant", "create", "q", "--quota", "max_memory_mb=1"),
        "422",
        "validation_error",
    )
    bad_quota = admin(server_url, "tenant", "create", "q", "--quota", "no-equals-sign")
    assert bad_quota.exit_code == 2
    assert "FIELD=VALUE" in bad_quota.stderr
    assert_clean_error(admin(server_url, "key", "revoke", "ten_nope", "key_nope"), "404")


def test_a_bad_admin_key_is_a_clean_error(server_url: str) -> None:
    result = admin(server_url, "tenant", "list", key="wrong-" + "x" * 30)
    assert_clean_error(result, "403", "admin_required")

    missing = corral("tenant", "list", CORRAL_URL=server_url)
    assert missing.exit_code == 2
    assert "--admin-key" in missing.stderr


def test_an_unreachable_server_is_a_clean_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = admin(f"http://127.0.0.1:{port}", "tenant", "list")
    assert_clean_error(result, "cannot reach")


def test_a_non_json_answer_is_a_clean_error() -> None:
    """A proxy's HTML error page (or any non-JSON body) is a clean error, not a traceback."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class BadGateway(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html><body>502 Bad Gateway</body></html>"
            self.send_response(502)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), BadGateway)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        result = admin(f"http://127.0.0.1:{proxy.server_address[1]}", "tenant", "list")
    finally:
        proxy.shutdown()
        proxy.server_close()
        thread.join(timeout=10)
    assert_clean_error(result, "502")


# --- usage --------------------------------------------------------------------------------
def test_usage_as_a_table_csv_and_json_agrees_with_the_api(server_url: str, api_key: str) -> None:
    import csv
    import io

    import httpx

    env = {"CORRAL_URL": server_url, "CORRAL_API_KEY": api_key}
    for cpu_ms in (1500, 2500):
        done = corral(
            "run", "-l", "fake", "-c", json.dumps({"stdout": "ok", "cpu_ms": cpu_ms}), **env
        )
        assert done.exit_code == 0, done.output
    headers = {"Authorization": f"Bearer {api_key}"}
    params = {"group_by": "tenant,language"}
    deadline = time.monotonic() + 10
    while True:  # results are stored as they come
        api = httpx.get(f"{server_url}/v1/usage", params=params, headers=headers).json()
        if api["total"]["events"] >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert api["total"]["events"] == 2 and api["total"]["cpu_s"] == pytest.approx(4.0)

    as_json = corral("usage", "--group-by", "tenant,language", "--format", "json", **env)
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout)["rows"] == api["rows"]

    as_csv = corral("usage", "--group-by", "tenant,language", "--format", "csv", **env)
    assert as_csv.exit_code == 0, as_csv.output
    [row, total] = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert (row["tenant"], row["language"]) == ("runner", "fake")
    assert float(row["cpu_s"]) == pytest.approx(4.0) and float(row["cost"]) == pytest.approx(
        api["rows"][0]["cost"]
    )
    assert total["tenant"] == "total" and int(total["events"]) == 2

    table = corral("usage", "--group-by", "tenant,language", **env)
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["tenant", "language", "events", "failures"]
    runner = lines[1].split()
    assert runner[:3] == ["runner", "fake", "2"] and float(runner[4]) == pytest.approx(4.0)
    assert f"{api['rows'][0]['cost']:.6f}" in lines[1]
    assert lines[2].split()[0] == "total"

    refused = corral("usage", "--group-by", "colour", **env)
    assert_clean_error(refused, "422", "unknown grouping")
