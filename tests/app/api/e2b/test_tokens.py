"""Sandbox access tokens (``app.api.e2b.tokens``): made and checked, the secret kept; and with
the real ``e2b`` SDK on crun, the token a create hands out reaches its own sandbox and
nothing else (another sandbox of the same tenant, the control plane, ``/v1``), and stops
with its sandbox."""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import pytest
from e2b import AuthenticationException, ConnectionConfig, Sandbox, SandboxException
from e2b_code_interpreter import Sandbox as CodeSandbox
from packaging.version import Version

from app.api.e2b.control import ENVD_VERSION
from app.api.e2b.tokens import SECRET_FILE, SandboxTokens, load_secret
from tests.app.api.e2b.conftest import Corral

SECRET = b"s" * 32


def test_a_token_is_valid_for_its_tenant_and_sandbox_until_it_expires() -> None:
    tokens = SandboxTokens(SECRET)
    token = tokens.mint("ten_a", "sbx_0123456789abcdef0123", expires_at=2_000.9)
    claim = SandboxTokens.claim(token)
    assert claim is not None and (claim.sandbox_id, claim.expires_at) == (
        "sbx_0123456789abcdef0123",
        2000,
    )
    assert tokens.valid(claim, tenant_id="ten_a", now=1_999.0)
    assert not tokens.valid(claim, tenant_id="ten_b", now=1_999.0)  # another tenant's
    assert not tokens.valid(claim, tenant_id="ten_a", now=2_000.0)  # expired
    assert not SandboxTokens(b"t" * 32).valid(claim, tenant_id="ten_a", now=0.0)
    forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    forged_claim = SandboxTokens.claim(forged)
    assert forged_claim is not None and not tokens.valid(forged_claim, tenant_id="ten_a", now=0)
    for not_a_token in ("", "crl_key_" + "0" * 20 + "_" + "x" * 43, token + "x", "crl_sbt_x"):
        assert SandboxTokens.claim(not_a_token) is None
    with pytest.raises(ValueError):
        SandboxTokens(b"short")


def test_the_secret_is_generated_once_private_and_the_setting_wins(tmp_path: Path) -> None:
    first = load_secret(None, tmp_path)
    path = tmp_path / SECRET_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(first) >= 32
    assert load_secret(None, tmp_path) == first  # kept: tokens survive a restart
    path.chmod(0o644)
    assert load_secret(None, tmp_path) == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_secret("c" * 40, tmp_path) == b"c" * 40
    with pytest.raises(ValueError, match="at least 32"):
        load_secret("too-short", tmp_path)
    (tmp_path / "other").mkdir()
    assert load_secret(None, tmp_path / "other") != first  # random, never a constant


def holding(token: str, sandbox_id: str) -> Sandbox:
    """The SDK's own sandbox object for ``sandbox_id``, made as ``Sandbox.connect`` makes
    it, but holding ``token`` (as an agent handed another sandbox's token would)."""
    headers = {
        "E2b-Sandbox-Id": sandbox_id,
        "E2b-Sandbox-Port": str(ConnectionConfig.envd_port),
        "X-Access-Token": token,
    }
    return Sandbox(
        sandbox_id=sandbox_id,
        sandbox_domain=None,
        envd_version=Version(ENVD_VERSION),
        envd_access_token=token,
        traffic_access_token=token,
        connection_config=ConnectionConfig(extra_sandbox_headers=headers),
    )


@pytest.mark.crun
@pytest.mark.slow
def test_a_sandbox_token_reaches_its_sandbox_and_nothing_else(corral: Corral) -> None:
    a = Sandbox.create(template="python", timeout=120)
    b = Sandbox.create(template="python", timeout=120)
    try:
        token_a = a._envd_access_token
        assert token_a is not None and token_a.startswith("crl_sbt_")
        assert corral.key not in token_a and a.traffic_access_token == token_a
        assert token_a != b._envd_access_token
        assert a.commands.run("echo mine").stdout == "mine\n"  # the SDK sends the token
        assert holding(token_a, a.sandbox_id).files.read("/etc/hostname")

        # sandbox B, of the same tenant, through the SDK and by hand
        stolen = holding(token_a, b.sandbox_id)
        with pytest.raises(AuthenticationException):
            stolen.commands.run("echo theirs")
        with pytest.raises((AuthenticationException, SandboxException)):
            stolen.files.read("/etc/hostname")
        on_b = {"E2b-Sandbox-Id": b.sandbox_id}
        for method, path, headers in (
            ("POST", "/process.Process/List", {"X-Access-Token": token_a}),
            ("GET", "/health", {"X-Access-Token": token_a}),
            ("GET", "/contexts", {"E2B-Traffic-Access-Token": token_a}),
        ):
            answer = httpx.request(
                method, f"{corral.url}{path}", json={}, headers=on_b | headers, timeout=30
            )
            assert answer.status_code == 401, (path, answer.text)
        interpreter = CodeSandbox.connect(a.sandbox_id)
        assert interpreter.run_code("6 * 7").text == "42"

        # nor the control plane, nor Corral's own API
        with pytest.raises(AuthenticationException):
            Sandbox.list(api_key=token_a).next_items()
        with pytest.raises(AuthenticationException):
            Sandbox.create(template="python", api_key=token_a)
        with pytest.raises(AuthenticationException):
            Sandbox.get_info(a.sandbox_id, api_key=token_a)
        bearer = {"Authorization": f"Bearer {token_a}"}
        run = httpx.post(
            f"{corral.url}/v1/run", json={"language": "python", "code": "print(1)"}, headers=bearer
        )
        assert run.status_code == 401 and run.json()["error"]["code"] == "invalid_api_key"
        listed = httpx.get(f"{corral.url}/v1/sandboxes", headers={"X-API-Key": token_a})
        assert listed.status_code == 401

        # a token tampered with (another expiry) is no token
        sandbox_id, expiry, mac = token_a.removeprefix("crl_sbt_").split(".")
        later = f"crl_sbt_{sandbox_id}.{int(expiry) + 86_400}.{mac}"
        with pytest.raises(AuthenticationException):
            holding(later, a.sandbox_id).commands.run("true")

        # connect hands out the token again, and B's works on B
        assert Sandbox.connect(a.sandbox_id)._envd_access_token == token_a
        assert b.commands.run("echo theirs").stdout == "theirs\n"

        # the token ends with its sandbox
        a.kill()
        gone = httpx.post(
            f"{corral.url}/process.Process/List",
            json={},
            headers={"E2b-Sandbox-Id": a.sandbox_id, "X-Access-Token": token_a},
        )
        assert gone.json()["code"] == "unavailable" and "was not found" in gone.text
        health = httpx.get(
            f"{corral.url}/health",
            headers={"E2b-Sandbox-Id": a.sandbox_id, "X-Access-Token": token_a},
        )
        assert health.status_code == 502
    finally:
        a.kill()
        b.kill()
