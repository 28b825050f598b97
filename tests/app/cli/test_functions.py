"""``corral run`` (against a server with the fake backend) and ``corral functions``: deploy
every example in ``functions/`` to a live server with real backends, list them and invoke
each."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from app.cli import main
from tests.app.cli import conftest as cli
from tests.conftest import ADMIN
from tests.requirements import require_tool

REPO = Path(__file__).resolve().parents[3]
INTERPRETERS = Path(os.environ.get("CORRAL_DATA_DIR", REPO / "var")) / "wasm" / "interpreters"

# (example dir, input, expected output)
EXAMPLES = [
    ("word-count", {"text": "to be or not to be", "top": 2}, None),
    ("slugify", {"title": "Hello, Wörld!"}, {"slug": "hello-world"}),
    ("fib-c", {"n": 10}, {"n": 10, "fib": 55}),
]


def corral(url: str, key: str, *args: str) -> Result:
    env = {"CORRAL_URL": url, "CORRAL_API_KEY": key}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


@pytest.fixture
def server(live_server: Any) -> tuple[str, str]:
    url = live_server(
        runtimes=["nsjail", "wasm"],
        wasm={"interpreters_dir": str(INTERPRETERS), "warm_per_language": 1},
        nsjail={"warm_per_language": 1},
    )
    created = httpx.post(f"{url}/v1/tenants", json={"name": "cli-fn"}, headers=ADMIN)
    assert created.status_code == 201, created.text
    return url, created.json()["key"]["api_key"]


@pytest.mark.nsjail
@pytest.mark.slow
def test_deploy_list_and_invoke_every_example(server: tuple[str, str], tmp_path: Path) -> None:
    require_tool("clang", "scripts/setup-wasm.sh")
    url, key = server
    for name, value, expected in EXAMPLES:
        directory = tmp_path / name  # a copy: deploying fib-c builds fib.wasm next to fib.c
        shutil.copytree(REPO / "functions" / name, directory)
        deployed = corral(url, key, "functions", "deploy", str(directory))
        assert deployed.exit_code == 0, deployed.output
        assert f"{name}: registered version 1" in deployed.stdout
        again = corral(url, key, "functions", "deploy", str(directory))
        assert "unchanged, still version 1" in again.stdout

        invoked = corral(url, key, "functions", "invoke", name, "--input", json.dumps(value))
        assert invoked.exit_code == 0, invoked.output
        result = json.loads(invoked.stdout)
        assert result["status"] == "succeeded", result
        if expected is not None:
            assert result["output"] == expected
    assert (tmp_path / "fib-c" / "fib.wasm").is_file()

    listed = json.loads(corral(url, key, "functions", "list").stdout)
    assert sorted(f["name"] for f in listed["functions"]) == sorted(n for n, _, _ in EXAMPLES)

    word_count = json.loads(
        corral(url, key, "functions", "invoke", "word-count", "--input", '{"text": "a a b"}').stdout
    )
    assert word_count["output"]["top"] == [["a", 2], ["b", 1]]


def test_invoke_errors_are_clean(live_server: Any, tmp_path: Path) -> None:
    url = live_server()  # the fake runtime: nothing here runs
    created = httpx.post(f"{url}/v1/tenants", json={"name": "cli-err"}, headers=ADMIN)
    key = created.json()["key"]["api_key"]
    missing = corral(url, key, "functions", "invoke", "nope", "--input", "{}")
    assert missing.exit_code == 1
    assert "404 not_found" in missing.stderr
    bad = corral(url, key, "functions", "invoke", "nope", "--input", "{")
    assert bad.exit_code == 2
    assert "not JSON" in bad.stderr
    empty = corral(url, key, "functions", "deploy", str(tmp_path))
    assert empty.exit_code == 2
    assert "no function.json" in empty.stderr


# --- run ----------------------------------------------------------------------------------


def test_run_prints_output_and_exits_with_the_programs_code(
    server_url: str, api_key: str, tmp_path: Any
) -> None:
    env = {"CORRAL_URL": server_url, "CORRAL_API_KEY": api_key}

    ok = cli.corral("run", "-l", "fake", "-c", json.dumps({"stdout": "hi\n"}), **env)
    assert ok.exit_code == 0, ok.output
    assert ok.stdout == "hi\n"

    failing = json.dumps({"stdout": "partial", "stderr": "oops", "exit": 3})
    failed = cli.corral("run", "-l", "fake", "-c", failing, **env)
    assert failed.exit_code == 3
    assert failed.stdout == "partial"
    assert failed.stderr == "oops"

    source = tmp_path / "program.json"
    source.write_text(json.dumps({"stdout": "from a file ", "exit": 5}))
    stdin = tmp_path / "input.txt"
    stdin.write_text("and stdin")
    from_file = cli.corral("run", "-l", "fake", str(source), "--stdin", str(stdin), **env)
    assert from_file.exit_code == 5
    assert from_file.stdout == "from a file and stdin"

    as_json = cli.corral("run", "-l", "fake", "--json", "-c", failing, **env)
    assert as_json.exit_code == 3
    result = json.loads(as_json.stdout)
    assert result["status"] == "failed"
    assert result["run"]["exit_code"] == 3
    assert result["invocation_id"].startswith("inv_")


def test_run_exit_codes_for_timeouts_and_platform_errors(server_url: str, api_key: str) -> None:
    env = {"CORRAL_URL": server_url, "CORRAL_API_KEY": api_key}

    slow = cli.corral("run", "-l", "fake", "--timeout", "0.1", "-c", '{"sleep": 5}', **env)
    assert slow.exit_code == 1  # did not finish
    assert "time_limit" in slow.stderr

    crashed = cli.corral("run", "-l", "fake", "-c", '{"crash": true}', **env)
    assert crashed.exit_code == 2  # the platform failed
    assert "[error: fake backend crashed on purpose]" in crashed.stderr


def test_run_usage_and_request_errors(server_url: str, api_key: str) -> None:
    env = {"CORRAL_URL": server_url, "CORRAL_API_KEY": api_key}

    neither = cli.corral("run", "-l", "fake", **env)
    assert neither.exit_code == 2
    assert "exactly one of -c CODE or FILE" in neither.stderr

    unknown = cli.corral("run", "-l", "cobol", "-c", "x", **env)
    cli.assert_clean_error(unknown, "400", "unsupported_runtime")

    no_key = cli.corral("run", "-l", "fake", "-c", "{}", CORRAL_URL=server_url)
    cli.assert_clean_error(no_key, "401", "missing_api_key")
