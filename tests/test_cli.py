"""The ``corral`` command (against a real server on a free port) and Settings' guards."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn
from click.testing import CliRunner, Result
from pydantic import ValidationError

from app.cli import main
from app.main import create_app
from app.settings import MIN_ADMIN_KEY_LENGTH, Settings
from runtimes.node.settings import NodeSettings
from tests.conftest import ADMIN_KEY

STRONG_KEY = "k3y-" + "Zq8" * 10

#: Every command, as its argv; each must answer --help.
COMMANDS = [
    [],
    ["serve"],
    ["gateway"],
    ["node"],
    ["db"],
    ["db", "upgrade"],
    ["tenant"],
    ["tenant", "create"],
    ["tenant", "list"],
    ["key"],
    ["key", "create"],
    ["key", "revoke"],
    ["run"],
    ["usage"],
    ["functions"],
    ["functions", "deploy"],
    ["functions", "list"],
    ["functions", "invoke"],
    ["images"],
    ["images", "build"],
    ["images", "import"],
    ["images", "ls"],
    ["images", "rm"],
    ["sandbox"],
    ["sandbox", "create"],
    ["sandbox", "exec"],
    ["sandbox", "cp"],
    ["sandbox", "ls"],
    ["sandbox", "rm"],
    ["sandbox", "pause"],
    ["sandbox", "resume"],
]


@pytest.fixture(autouse=True)
def _no_corral_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings and the CLI read CORRAL_* variables: start every test without them."""
    import os

    for name in list(os.environ):
        if name.startswith("CORRAL_") and not name.startswith("CORRAL_TEST_"):
            monkeypatch.delenv(name)


@pytest.fixture
def server_url(make_settings: Callable[..., Settings]) -> Iterator[str]:
    """A real Corral server (uvicorn, embedded stack, fake runtime) on a free port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(make_settings()),
        log_level="warning",
        access_log=False,
        ws="none",
        lifespan="on",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive(), "the server failed to start"
            assert time.monotonic() < deadline, "the server did not start in time"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"


def corral(*args: str, **env: str | None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def admin(url: str, *args: str, key: str = ADMIN_KEY) -> Result:
    return corral(*args, CORRAL_URL=url, CORRAL_ADMIN_KEY=key)


def assert_clean_error(result: Result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("Error: "), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr
    assert "Traceback" not in result.output


# --- help ---------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: " ".join(argv) or "corral")
def test_help(argv: list[str]) -> None:
    result = corral(*argv, "--help")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Usage: ")
    assert "--help" in result.stdout


def test_top_level_help_lists_every_command() -> None:
    result = corral("-h")
    assert result.exit_code == 0
    for name in ("serve", "gateway", "node", "db", "tenant", "key", "run"):
        assert name in result.stdout


def test_help_covers_every_registered_command() -> None:
    import click

    def walk(group: click.Group, prefix: list[str]) -> Iterator[list[str]]:
        for name, command in group.commands.items():
            yield [*prefix, name]
            if isinstance(command, click.Group):
                yield from walk(command, [*prefix, name])

    assert sorted(walk(main, [])) == sorted(c for c in COMMANDS if c)


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


# --- run ----------------------------------------------------------------------------------


@pytest.fixture
def api_key(server_url: str) -> str:
    created = admin(server_url, "tenant", "create", "runner")
    assert created.exit_code == 0, created.output
    return str(json.loads(created.stdout)["key"]["api_key"])


def test_run_prints_output_and_exits_with_the_programs_code(
    server_url: str, api_key: str, tmp_path: Any
) -> None:
    env = {"CORRAL_URL": server_url, "CORRAL_API_KEY": api_key}

    ok = corral("run", "-l", "fake", "-c", json.dumps({"stdout": "hi\n"}), **env)
    assert ok.exit_code == 0, ok.output
    assert ok.stdout == "hi\n"

    failing = json.dumps({"stdout": "partial", "stderr": "oops", "exit": 3})
    failed = corral("run", "-l", "fake", "-c", failing, **env)
    assert failed.exit_code == 3
    assert failed.stdout == "partial"
    assert failed.stderr == "oops"

    source = tmp_path / "program.json"
    source.write_text(json.dumps({"stdout": "from a file ", "exit": 5}))
    stdin = tmp_path / "input.txt"
    stdin.write_text("and stdin")
    from_file = corral("run", "-l", "fake", str(source), "--stdin", str(stdin), **env)
    assert from_file.exit_code == 5
    assert from_file.stdout == "from a file and stdin"

    as_json = corral("run", "-l", "fake", "--json", "-c", failing, **env)
    assert as_json.exit_code == 3
    result = json.loads(as_json.stdout)
    assert result["status"] == "failed"
    assert result["run"]["exit_code"] == 3
    assert result["invocation_id"].startswith("inv_")


def test_run_exit_codes_for_timeouts_and_platform_errors(server_url: str, api_key: str) -> None:
    env = {"CORRAL_URL": server_url, "CORRAL_API_KEY": api_key}

    slow = corral("run", "-l", "fake", "--timeout", "0.1", "-c", '{"sleep": 5}', **env)
    assert slow.exit_code == 1  # did not finish
    assert "time_limit" in slow.stderr

    crashed = corral("run", "-l", "fake", "-c", '{"crash": true}', **env)
    assert crashed.exit_code == 2  # the platform failed
    assert "[error: fake backend crashed on purpose]" in crashed.stderr


def test_run_usage_and_request_errors(server_url: str, api_key: str) -> None:
    env = {"CORRAL_URL": server_url, "CORRAL_API_KEY": api_key}

    neither = corral("run", "-l", "fake", **env)
    assert neither.exit_code == 2
    assert "exactly one of -c CODE or FILE" in neither.stderr

    unknown = corral("run", "-l", "cobol", "-c", "x", **env)
    assert_clean_error(unknown, "400", "unsupported_runtime")

    no_key = corral("run", "-l", "fake", "-c", "{}", CORRAL_URL=server_url)
    assert_clean_error(no_key, "401", "missing_api_key")


# --- settings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "admin_key",
    [None, "", "changeme", "CHANGEME", "secret", "short-" + "x" * (MIN_ADMIN_KEY_LENGTH - 7)],
    ids=["missing", "empty", "changeme", "CHANGEME", "secret", "short"],
)
def test_settings_refuse_a_weak_admin_key_outside_dev_mode(admin_key: str | None) -> None:
    with pytest.raises(ValidationError, match="CORRAL_ADMIN_KEY must be set"):
        Settings(dev_mode=False, admin_key=admin_key)


def test_node_settings_refuse_the_fake_runtime_outside_dev_mode() -> None:
    with pytest.raises(ValidationError, match="fake runtime is for tests only"):
        NodeSettings(dev_mode=False, runtimes=["fake"])
    with pytest.raises(ValidationError, match="fake runtime"):
        NodeSettings(dev_mode=False, runtimes=["nsjail", "fake"])
    assert NodeSettings(dev_mode=True, runtimes=["fake"]).runtimes == ["fake"]


def test_failpoints_need_dev_mode() -> None:
    with pytest.raises(ValidationError, match="CORRAL_FAILPOINTS needs CORRAL_DEV_MODE"):
        Settings(dev_mode=False, admin_key=STRONG_KEY, failpoints={"x": "kill"})
    assert Settings(dev_mode=True, failpoints={"x": "kill"}).failpoints == {"x": "kill"}


def test_settings_accept_a_strong_admin_key() -> None:
    settings = Settings(dev_mode=False, admin_key=STRONG_KEY)
    assert settings.admin_key is not None
    assert settings.admin_key.get_secret_value() == STRONG_KEY
    assert STRONG_KEY not in repr(settings)  # a secret, never printed
    exactly_long_enough = "a" * MIN_ADMIN_KEY_LENGTH
    assert Settings(dev_mode=False, admin_key=exactly_long_enough).admin_key is not None


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_ADMIN_KEY", "changeme")
    with pytest.raises(ValidationError, match="CORRAL_ADMIN_KEY"):
        Settings()
    monkeypatch.setenv("CORRAL_ADMIN_KEY", STRONG_KEY)
    assert Settings().admin_key is not None
    monkeypatch.setenv("CORRAL_RUNTIMES", '["fake"]')
    with pytest.raises(ValidationError, match="fake runtime"):
        Settings()  # the embedded node's settings are read with the gateway's
    monkeypatch.setenv("CORRAL_DEV_MODE", "1")
    monkeypatch.setenv("CORRAL_ADMIN_KEY", "")
    monkeypatch.setenv("CORRAL_NODE_SLOTS", "3")
    settings = Settings()  # dev mode allows both
    assert settings.node.runtimes == ["fake"] and settings.node.node_slots == 3


def test_dev_mode_allows_no_admin_key() -> None:
    assert Settings(dev_mode=True).admin_key is None


def test_resolved_database_url() -> None:
    pg = Settings(dev_mode=True, database_url="postgresql://u@h:5/db").resolved_database_url
    assert pg == "postgresql+asyncpg://u@h:5/db"
    assert Settings(dev_mode=True, database_url="postgres://h/db").resolved_database_url == (
        "postgresql+asyncpg://h/db"
    )
    lite = Settings(dev_mode=True, database_url="sqlite:////tmp/x.db").resolved_database_url
    assert lite == "sqlite+aiosqlite:////tmp/x.db"
    default = Settings(dev_mode=True).resolved_database_url
    assert default.startswith("sqlite+aiosqlite:///") and default.endswith("/corral.db")


def test_server_commands_refuse_a_weak_admin_key_cleanly() -> None:
    for command in ("serve", "gateway"):
        result = corral(command, CORRAL_ADMIN_KEY="changeme", CORRAL_RUNTIMES='["nsjail"]')
        assert result.exit_code == 2, (command, result.output)
        assert "CORRAL_ADMIN_KEY must be set" in result.stderr
        assert "Traceback" not in result.output


def test_node_needs_only_a_redis_url() -> None:
    """A node is told no database and no admin key; without Redis it says what it lacks."""
    result = corral("node", CORRAL_ADMIN_KEY="changeme", CORRAL_RUNTIMES='["nsjail"]')
    assert result.exit_code == 2, result.output
    assert "needs CORRAL_REDIS_URL" in result.stderr
    assert "ADMIN_KEY" not in result.stderr and "Traceback" not in result.output
    fields = set(NodeSettings.model_fields)
    assert not fields & {"database_url", "admin_key", "run_migrations"}


def test_db_upgrade_command(tmp_path: Any) -> None:
    result = corral("db", "upgrade", CORRAL_DEV_MODE="1", CORRAL_DATA_DIR=str(tmp_path))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "database at head"
    assert (tmp_path / "corral.db").exists()


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
