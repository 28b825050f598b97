"""The ``e2b`` SDK against the tenant's sandbox quotas (fake sandbox backend): sizes of a
create, the rate of sandbox calls and the daily CPU budget, on the control plane and the
in-sandbox routes alike."""

from __future__ import annotations

import time

import httpx
import pytest
from e2b import CommandExitException, RateLimitException, Sandbox, SandboxException

from tests.app.api.e2b.conftest import Corral
from tests.conftest import ADMIN


def test_sandbox_calls_are_rate_limited_on_the_e2b_routes_too(fake_corral: Corral) -> None:
    sbx = Sandbox.create(template="python")
    fake_corral.quota(sandbox_calls_per_second=0.01, sandbox_call_burst=3)
    sbx.files.write("/home/user/a.txt", "a")  # in-sandbox
    assert sbx.files.read("/home/user/a.txt") == "a"
    assert Sandbox.get_info(sbx.sandbox_id).sandbox_id == sbx.sandbox_id  # control plane
    with pytest.raises(RateLimitException) as in_sandbox:
        sbx.files.list("/home/user")
    assert "sandbox_calls_per_second" in str(in_sandbox.value)
    with pytest.raises(RateLimitException):
        Sandbox.list().next_items()
    limited = httpx.get(
        f"{fake_corral.url}/health",
        headers={"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token or ""},
    )
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
    fake_corral.quota(sandbox_calls_per_second=1000, sandbox_call_burst=1000)
    assert sbx.kill() is True


def test_commands_and_connects_stop_at_the_daily_cpu_quota(fake_corral: Corral) -> None:
    """The fake backend reads 1 ms of CPU per sandbox: with a 1 ms budget a sandbox whose
    reading reached its record has used the tenant's day."""
    sbx = Sandbox.create(template="python")
    fake_corral.quota(cpu_seconds_per_day=0.001)
    Sandbox.get_info(sbx.sandbox_id)  # the node's CPU reading reaches the record
    deadline = time.monotonic() + 10
    refused: Exception | None = None
    while refused is None and time.monotonic() < deadline:  # the reading is cached 1 s
        try:
            sbx.commands.run("echo hi")
        except RateLimitException as exc:
            refused = exc
        except CommandExitException:
            pass  # ran: the fake backend has no /bin/bash (exit 127)
        time.sleep(0.1)
    assert refused is not None and "cpu_seconds_per_day" in str(refused)
    with pytest.raises(RateLimitException):
        Sandbox.connect(sbx.sandbox_id)
    execute = httpx.post(
        f"{fake_corral.url}/execute",
        json={"code": "1"},
        headers={
            "E2b-Sandbox-Id": sbx.sandbox_id,
            "E2B-Traffic-Access-Token": sbx.traffic_access_token or "",
        },
    )
    assert execute.status_code == 429 and "cpu_seconds_per_day" in execute.text
    with pytest.raises(RateLimitException):
        Sandbox.create(template="python")
    sbx.pause()
    with pytest.raises(RateLimitException):
        Sandbox.connect(sbx.sandbox_id)  # a paused sandbox stays paused
    assert Sandbox.get_info(sbx.sandbox_id).state.value == "paused"
    fake_corral.quota(cpu_seconds_per_day=86_400)
    assert Sandbox.connect(sbx.sandbox_id).get_info().state.value == "running"
    assert sbx.kill() is True


def test_a_create_past_the_tenants_sandbox_quota_is_refused(fake_corral: Corral) -> None:
    fake_corral.quota(max_concurrent_sandboxes=8, max_sandboxes_memory_mb=1024)
    first = Sandbox.create(template="python")
    second = Sandbox.create(template="python")
    with pytest.raises(RateLimitException) as third:
        Sandbox.create(template="python")
    assert "max_sandboxes_memory_mb" in str(third.value)
    assert {s.sandbox_id for s in Sandbox.list().next_items()} == {
        first.sandbox_id,
        second.sandbox_id,
    }
    assert first.kill() and second.kill()


def test_a_disabled_tenants_sandbox_tokens_stop_working(fake_corral: Corral) -> None:
    sbx = Sandbox.create(template="python")
    assert (sbx._envd_access_token or "").startswith("crl_sbt_")  # not the tenant's key
    sbx.files.write("/home/user/a.txt", "a")
    disabled = httpx.patch(
        f"{fake_corral.url}/v1/tenants/{fake_corral.tenant_id}",
        json={"disabled": True},
        headers=ADMIN,
    )
    assert disabled.status_code == 200
    with pytest.raises(SandboxException) as refused:
        sbx.files.read("/home/user/a.txt")
    assert "disabled" in str(refused.value)
