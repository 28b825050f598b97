"""``corral sandbox``: the CLI over the SDK, against a real server (fake sandbox backend)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from app.cli import main
from corral import Corral
from tests.corral.server import SandboxServer, start


@pytest.fixture
def server(live_server: Callable[..., str], tmp_path: Path) -> SandboxServer:
    return start(live_server, tmp_path)


def sandbox(server: SandboxServer, *args: str, stdin: bytes | None = None) -> Result:
    env = {"CORRAL_URL": server.url, "CORRAL_API_KEY": server.key}
    return CliRunner().invoke(main, ["sandbox", *args], env=env, input=stdin)


def created(server: SandboxServer, *args: str) -> str:
    result = sandbox(server, "create", "--backend", "fake", *args)
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def test_create_prints_the_id_or_the_record(server: SandboxServer) -> None:
    sandbox_id = created(server, "--memory-mb", "128", "--ttl", "60")
    assert sandbox_id.startswith("sbx") and "\n" not in sandbox_id
    as_json = sandbox(
        server, "create", "--backend", "fake", "--json", "--meta", "run=7", "--env", "A=1"
    )
    assert as_json.exit_code == 0, as_json.output
    record = json.loads(as_json.stdout)
    assert record["state"] == "running" and record["metadata"] == {"run": "7"}
    assert record["created_at"].startswith("20") and record["timings"]["start_ms"] is not None
    with Corral(server.url, server.key) as client:
        info = client.sandboxes.get(sandbox_id).info
        assert info.memory_mb == 128
        assert "A=1\n" in client.sandboxes.get(record["id"]).exec(["env"]).stdout
    bad = sandbox(server, "create", "--backend", "fake", "--env", "no-equals")
    assert bad.exit_code == 2 and "KEY=VALUE" in bad.stderr


def test_create_passes_the_allow_list_and_the_user(server: SandboxServer) -> None:
    as_json = sandbox(
        server,
        "create",
        "--backend",
        "fake",
        "--json",
        "--allow",
        "10.1.2.3:8080",
        "--allow",
        "0.0.0.0/0:443",
    )
    assert as_json.exit_code == 0, as_json.output
    record = json.loads(as_json.stdout)
    assert record["network"] == ["10.1.2.3:8080", "0.0.0.0/0:443"]
    with Corral(server.url, server.key) as client:
        assert client.sandboxes.get(record["id"]).info.network == record["network"]
    offline = json.loads(sandbox(server, "create", "--backend", "fake", "--json").stdout)
    assert offline["network"] == []
    bad = sandbox(server, "create", "--backend", "fake", "--allow", "not a host")
    assert bad.exit_code != 0 and "network entry" in bad.output
    # the user is passed on as given: one the server refuses says so
    nobody = sandbox(server, "create", "--backend", "fake", "--user", "x" * 65)
    assert nobody.exit_code != 0 and "user" in nobody.output


def test_exec_streams_and_exits_with_the_commands_code(server: SandboxServer) -> None:
    sandbox_id = created(server, "--env", "GREETING=hi")
    ok = sandbox(server, "exec", sandbox_id, "--", "echo", "hello", "world")
    assert (ok.exit_code, ok.stdout, ok.stderr) == (0, "hello world\n", "")
    env = sandbox(server, "exec", "--env", "MORE=1", sandbox_id, "env")
    assert env.exit_code == 0 and "GREETING=hi\nMORE=1\n" in env.stdout
    failed = sandbox(server, "exec", sandbox_id, "--", "exit", "3")
    assert failed.exit_code == 3 and failed.stdout == ""
    unknown = sandbox(server, "exec", sandbox_id, "--", "nosuch", "-x")
    assert unknown.exit_code == 127 and unknown.stderr == "nosuch: command not found\n"
    shell = sandbox(server, "exec", "--shell", sandbox_id, "--", "echo", "a", "|", "wc")
    assert shell.exit_code == 127 and shell.stderr == "/bin/sh: command not found\n"
    slow = sandbox(server, "exec", "--timeout", "0.2", sandbox_id, "--", "sleep", "5")
    assert slow.exit_code == 124 and "[timed out after 0.2 s]" in slow.stderr
    gone = sandbox(server, "exec", "sbx_nope", "--", "echo")
    assert gone.exit_code == 1 and gone.stderr.startswith("Error: 404 not_found: ")


def test_cp_uploads_and_downloads_one_file(server: SandboxServer, tmp_path: Path) -> None:
    sandbox_id = created(server)
    local = tmp_path / "data.bin"
    local.write_bytes(b"\x00binary\xff")
    up = sandbox(server, "cp", str(local), f"{sandbox_id}:/home/user/")
    assert up.exit_code == 0, up.output
    into = sandbox(server, "cp", str(local), f"{sandbox_id}:/home/user/renamed.bin")
    assert into.exit_code == 0, into.output
    piped = sandbox(server, "cp", "-", f"{sandbox_id}:/tmp/stdin.txt", stdin=b"from stdin")
    assert piped.exit_code == 0, piped.output
    with Corral(server.url, server.key) as client:
        files = client.sandboxes.get(sandbox_id).files
        assert files.read("/home/user/data.bin") == b"\x00binary\xff"
        assert files.read("/home/user/renamed.bin") == b"\x00binary\xff"
        assert files.read_text("/tmp/stdin.txt") == "from stdin"

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    down = sandbox(server, "cp", f"{sandbox_id}:/home/user/data.bin", str(out_dir))
    assert down.exit_code == 0, down.output
    assert (out_dir / "data.bin").read_bytes() == b"\x00binary\xff"
    named = sandbox(server, "cp", f"{sandbox_id}:/tmp/stdin.txt", str(out_dir / "x.txt"))
    assert named.exit_code == 0 and (out_dir / "x.txt").read_text() == "from stdin"
    to_stdout = sandbox(server, "cp", f"{sandbox_id}:/tmp/stdin.txt", "-")
    assert to_stdout.exit_code == 0 and to_stdout.stdout == "from stdin"


def test_cp_streams_a_file_over_the_body_cap_both_ways(
    server: SandboxServer, tmp_path: Path
) -> None:
    sandbox_id = created(server)
    here = tmp_path / "here"
    here.mkdir()
    local = here / "big.bin"
    local.write_bytes(os.urandom(9 << 20))  # over the 8 MiB body cap of other routes
    up = sandbox(server, "cp", str(local), f"{sandbox_id}:/home/user/big.bin")
    assert up.exit_code == 0, up.output
    with Corral(server.url, server.key) as client:
        assert client.sandboxes.get(sandbox_id).files.stat("/home/user/big.bin").size == 9 << 20
    back = here / "back.bin"
    down = sandbox(server, "cp", f"{sandbox_id}:/home/user/big.bin", str(back))
    assert down.exit_code == 0, down.output
    assert back.read_bytes() == local.read_bytes()
    assert sorted(p.name for p in here.iterdir()) == ["back.bin", "big.bin"]  # no partial


def test_cp_refuses_what_it_cannot_copy(server: SandboxServer, tmp_path: Path) -> None:
    sandbox_id = created(server)
    directory = sandbox(server, "cp", str(tmp_path), f"{sandbox_id}:/home/user/")
    assert directory.exit_code == 1 and "is a directory: cp copies one file" in directory.stderr
    remote_dir = sandbox(server, "cp", f"{sandbox_id}:/home/user", str(tmp_path))
    assert remote_dir.exit_code == 1 and "is a directory" in remote_dir.stderr
    both_local = sandbox(server, "cp", str(tmp_path / "a"), str(tmp_path / "b"))
    assert both_local.exit_code == 2 and "one of SRC and DST is ID:/path" in both_local.stderr
    missing = sandbox(server, "cp", f"{sandbox_id}:/nope", str(tmp_path / "n"))
    assert missing.exit_code == 1 and "404 path_not_found" in missing.stderr
    unreadable = sandbox(server, "cp", str(tmp_path / "absent"), f"{sandbox_id}:/x")
    assert unreadable.exit_code == 1 and "cannot read" in unreadable.stderr


def test_ls_lists_sandboxes_or_a_directory(server: SandboxServer) -> None:
    first, second = created(server), created(server)
    table = sandbox(server, "ls")
    assert table.exit_code == 0, table.output
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["ID", "STATE", "IMAGE", "CREATED", "EXPIRES"]
    assert sorted(row.split()[0] for row in rows) == sorted([first, second])
    assert all(row.split()[1:3] == ["running", "python"] for row in rows)
    as_json = sandbox(server, "ls", "--json")
    assert sorted(s["id"] for s in json.loads(as_json.stdout)) == sorted([first, second])

    with Corral(server.url, server.key) as client:
        client.sandboxes.get(first).files.write("/home/user/a.txt", "abc")
    listing = sandbox(server, "ls", f"{first}:/home")
    assert listing.exit_code == 0, listing.output
    assert listing.stdout.split() == ["drwxr-xr-x", "1000", "4096", "user/"]
    files = sandbox(server, "ls", "--json", f"{first}:/home/user")
    assert [(e["name"], e["size"]) for e in json.loads(files.stdout)] == [("a.txt", 3)]
    root = sandbox(server, "ls", first)
    assert {"home/", "tmp/"} <= {line.split()[-1] for line in root.stdout.splitlines()}


def test_pause_resume_and_rm(server: SandboxServer) -> None:
    sandbox_id = created(server)
    paused = sandbox(server, "pause", sandbox_id)
    assert (paused.exit_code, paused.stdout) == (0, f"{sandbox_id} paused\n")
    refused = sandbox(server, "exec", sandbox_id, "--", "echo")
    assert refused.exit_code == 1
    assert refused.stderr.startswith("Error: 409 sandbox_not_running: ")
    resumed = sandbox(server, "resume", sandbox_id)
    assert (resumed.exit_code, resumed.stdout) == (0, f"{sandbox_id} running\n")

    other = created(server)
    removed = sandbox(server, "rm", sandbox_id, "sbx_nope", other)
    assert removed.exit_code == 1
    assert removed.stdout.split() == [sandbox_id, other]
    assert "sbx_nope: 404 not_found" in removed.stderr
    assert sandbox(server, "ls").stdout.splitlines()[1:] == []


def test_an_unreachable_server_is_a_clean_error() -> None:
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(main, ["sandbox", "ls"], env={"CORRAL_URL": url})
    assert result.exit_code == 1 and result.stderr.startswith(f"Error: cannot reach {url}")
    assert "Traceback" not in result.output


def test_create_options_are_the_sdks_create_parameters() -> None:
    """The command passes its options on to ``Sandboxes.create`` as they are: each is one of
    its parameters, by name (review D44/D45: no second list to keep in step)."""
    import inspect

    from app.cli.sandbox import sandbox_create
    from corral import Sandboxes

    sdk = set(inspect.signature(Sandboxes.create).parameters) - {"self"}
    options = {p.name for p in sandbox_create.params} - {"as_json", "url", "api_key"}
    assert options and options <= sdk
