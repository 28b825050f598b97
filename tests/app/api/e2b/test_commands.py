"""The ``e2b`` SDK's control plane and commands, unchanged, against Corral on crun."""

from __future__ import annotations

import base64
import json
import os
import struct
import time
from datetime import UTC, datetime

import httpx
import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    NotFoundException,
    Sandbox,
    SandboxException,
    TimeoutException,
)

from node.sandboxes.crun.process import READ_CHUNK
from tests.app.api.e2b.conftest import Corral

pytestmark = [pytest.mark.crun, pytest.mark.slow]


def test_a_sandbox_lives_and_ends_through_the_control_plane(corral: Corral) -> None:
    sbx = Sandbox.create(template="python", timeout=120, metadata={"episode": "7"})
    assert sbx.is_running()
    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id and info.metadata == {"episode": "7"}
    assert info.template_id == "python" and info.state.value == "running"
    assert 100 < (info.end_at - datetime.now(UTC)).total_seconds() <= 120

    sbx.set_timeout(600)
    assert 590 < (sbx.get_info().end_at - datetime.now(UTC)).total_seconds() <= 600

    listed = Sandbox.list().next_items()
    assert [s.sandbox_id for s in listed] == [sbx.sandbox_id]
    assert Sandbox.list(query=_query({"episode": "8"})).next_items() == []

    again = Sandbox.connect(sbx.sandbox_id)
    assert again.commands.run("echo same").stdout == "same\n"

    record = httpx.get(
        f"{corral.url}/v1/sandboxes/{sbx.sandbox_id}",
        headers={"Authorization": f"Bearer {corral.key}"},
    ).json()
    assert record["state"] == "running" and record["image"] == "python"

    assert sbx.kill() is True
    assert sbx.is_running() is False
    assert Sandbox.kill(sbx.sandbox_id) is False  # gone already
    assert Sandbox.list().next_items() == []


def _query(metadata: dict[str, str]) -> object:
    from e2b import SandboxQuery

    return SandboxQuery(metadata=metadata)


def test_commands_run_with_output_envs_cwd_and_exit_codes(corral: Corral) -> None:
    sbx = Sandbox.create(template="python", timeout=120, envs={"FROM_SANDBOX": "s"})
    try:
        result = sbx.commands.run("echo hello; echo oops >&2")
        assert (result.exit_code, result.stdout, result.stderr) == (0, "hello\n", "oops\n")

        seen: list[str] = []
        env = sbx.commands.run(
            'echo "$FROM_SANDBOX $MINE"; pwd; whoami',
            envs={"MINE": "m"},
            cwd="/tmp",
            on_stdout=seen.append,
        )
        assert env.stdout == "s m\n/tmp\nuser\n" and "".join(seen) == env.stdout
        assert sbx.commands.run("pwd").stdout == "/home/user\n"
        assert sbx.commands.run("whoami", user="root").stdout == "root\n"

        with pytest.raises(CommandExitException) as failed:
            sbx.commands.run("echo bad >&2; exit 3")
        assert failed.value.exit_code == 3 and failed.value.stderr == "bad\n"
    finally:
        sbx.kill()


def test_command_output_is_the_bytes_the_command_wrote(corral: Corral) -> None:
    """A character cut by the node's 64 KiB reads reaches the SDK whole; envd's stream
    carries bytes that are not text exactly (the SDK itself only answers text)."""
    split = b"a" * (READ_CHUNK - 1) + "€".encode() * 100_000
    noise = os.urandom(300_000)
    sbx = Sandbox.create(template="python", timeout=120)
    try:
        sbx.files.write("/home/user/split", split)
        sbx.files.write("/home/user/noise", noise)
        assert sbx.commands.run("cat split").stdout == split.decode()
        assert _envd_stdout(corral, sbx.sandbox_id, "cat noise") == noise
    finally:
        sbx.kill()


def _envd_stdout(corral: Corral, sandbox_id: str, command: str) -> bytes:
    """What envd's process stream says a command wrote on stdout (Connect's JSON codec:
    enveloped messages, bytes as base64)."""
    message = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", command]}})
    body = struct.pack(">BI", 0, len(message)) + message.encode()
    answer = httpx.post(
        f"{corral.url}/process.Process/Start",
        content=body,
        headers={
            "content-type": "application/connect+json",
            "E2b-Sandbox-Id": sandbox_id,
            "X-Access-Token": corral.key,
        },
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    stdout, data = b"", answer.content
    while data:
        flags, size = struct.unpack(">BI", data[:5])
        event = json.loads(data[5 : 5 + size]).get("event", {})
        data = data[5 + size :]
        if not flags and "data" in event:
            stdout += base64.b64decode(event["data"].get("stdout", ""))
    return stdout


def test_background_commands_are_listed_fed_reconnected_and_killed(corral: Corral) -> None:
    sbx = Sandbox.create(template="python", timeout=120)
    try:
        sleeper = sbx.commands.run("sleep 300", background=True)
        cat = sbx.commands.run("cat", background=True, stdin=True)
        pids = {p.pid: p for p in sbx.commands.list()}
        assert set(pids) == {sleeper.pid, cat.pid}
        assert pids[sleeper.pid].cmd == "/bin/bash"
        assert pids[sleeper.pid].args == ["-l", "-c", "sleep 300"]

        sbx.commands.send_stdin(cat.pid, "line one\n")
        sbx.commands.close_stdin(cat.pid)
        assert cat.wait().stdout == "line one\n"

        again = sbx.commands.connect(sleeper.pid)
        assert sbx.commands.kill(sleeper.pid) is True
        with pytest.raises(CommandExitException) as killed:
            again.wait()
        assert killed.value.exit_code == -1
        assert sbx.commands.list() == []
        assert sbx.commands.kill(sleeper.pid) is False
    finally:
        sbx.kill()


def test_a_command_timeout_kills_it(corral: Corral) -> None:
    sbx = Sandbox.create(template="python", timeout=120)
    try:
        began = time.monotonic()
        with pytest.raises((TimeoutException, CommandExitException)):
            sbx.commands.run("sleep 30; touch /tmp/survived", timeout=1)
        assert time.monotonic() - began < 10
        time.sleep(0.5)
        assert sbx.commands.list() == []
        assert sbx.commands.run("ls /tmp").stdout == ""
    finally:
        sbx.kill()


def test_another_tenants_key_fails_on_the_sandbox(corral: Corral) -> None:
    sbx = Sandbox.create(template="python", timeout=120)
    try:
        other = corral.new_key("e2b-other")
        with pytest.raises(SandboxException) as control:
            Sandbox.get_info(sbx.sandbox_id, api_key=other)
        assert "not found" in str(control.value)
        assert Sandbox.kill(sbx.sandbox_id, api_key=other) is False
        assert Sandbox.list(api_key=other).next_items() == []
        with pytest.raises((NotFoundException, SandboxException)):
            Sandbox.connect(sbx.sandbox_id, api_key=other)

        # in-sandbox calls with the other tenant's key as the access token
        stolen = httpx.post(
            f"{corral.url}/process.Process/List",
            json={},
            headers={"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": other},
        )
        assert stolen.status_code == 404, stolen.text
        assert stolen.json()["code"] == "not_found"
        files = httpx.get(
            f"{corral.url}/files",
            params={"path": "/etc/hostname"},
            headers={"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": other},
        )
        assert files.status_code == 404
        anonymous = httpx.post(
            f"{corral.url}/process.Process/List",
            json={},
            headers={"E2b-Sandbox-Id": sbx.sandbox_id},
        )
        assert anonymous.status_code == 401
        with pytest.raises(AuthenticationException):
            Sandbox.create(template="python", api_key="crl_key_not_a_real_one")
        assert sbx.commands.run("echo still mine").stdout == "still mine\n"
    finally:
        sbx.kill()
