"""``corral invocations``: the tenant's history through the CLI, against a server with the
fake runtime."""

from __future__ import annotations

import json

from tests.app.cli import conftest as cli


def test_ls_filters_pages_and_get_shows_the_whole_result(server_url: str, api_key: str) -> None:
    env = {"CORRAL_URL": server_url, "CORRAL_API_KEY": api_key}
    ran = []
    for program in ({"stdout": "one\n"}, {"stdout": "two\n", "exit": 3}, {"stdout": "three\n"}):
        answer = cli.corral("run", "-l", "fake", "--json", "-c", json.dumps(program), **env)
        ran.append(json.loads(answer.stdout)["invocation_id"])

    listed = cli.corral("invocations", "ls", **env)
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "STATUS", "KIND"]
    assert [line.split()[0] for line in lines[1:]] == ran[::-1]  # newest first
    assert lines[2].split()[1] == "failed"

    failed = json.loads(
        cli.corral("invocations", "ls", "--status", "failed", "--json", **env).stdout
    )
    assert [i["invocation_id"] for i in failed["invocations"]] == [ran[1]]

    first = cli.corral("invocations", "ls", "--limit", "2", **env)
    assert [line.split()[0] for line in first.stdout.splitlines()[1:]] == ran[:0:-1]
    cursor = first.stderr.strip().removeprefix("next page: --cursor ")
    rest = cli.corral("invocations", "ls", "--limit", "2", "--cursor", cursor, **env)
    assert [line.split()[0] for line in rest.stdout.splitlines()[1:]] == [ran[0]]
    assert rest.stderr == ""

    whole = json.loads(cli.corral("invocations", "get", ran[1], **env).stdout)
    assert whole["run"]["stdout"] == "two\n" and whole["run"]["exit_code"] == 3

    missing = cli.corral("invocations", "get", "inv_nope", **env)
    assert missing.exit_code == 1 and "404" in missing.stderr
