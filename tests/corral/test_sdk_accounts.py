"""The SDK beyond sandboxes, against a real server on a socket (fake FnCall backend):
tenants and keys with the admin key, one-shot runs, usage (JSON and CSV) and tool
functions, each answered with the API's JSON as it came; errors as ``CorralError``s."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable

import pytest

from corral import AsyncCorral, Conflict, Corral, Forbidden, NotFound, Unauthenticated
from tests.conftest import ADMIN_KEY

CODE = "def handler(x):\n    return x\n"


@pytest.fixture(autouse=True)
def _no_corral_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_URL", raising=False)
    monkeypatch.delenv("CORRAL_API_KEY", raising=False)


@pytest.fixture
def url(live_server: Callable[..., str]) -> str:
    return live_server()


def test_tenants_and_keys_with_the_admin_key(url: str) -> None:
    with Corral(url, ADMIN_KEY) as operator:
        made = operator.tenants.create("sdk-team", quota={"max_concurrent_executions": 3})
        tenant_id = made["tenant"]["id"]
        assert made["tenant"]["quota"]["max_concurrent_executions"] == 3
        assert [t["id"] for t in operator.tenants.list()["tenants"]] == [tenant_id]
        with pytest.raises(Conflict):
            operator.tenants.create("sdk-team")
        key = operator.keys.create(tenant_id, name="ci")
        assert key["name"] == "ci" and key["api_key"].startswith("crl_key_")
        with Corral(url, key["api_key"]) as tenant:
            assert tenant.run("fake", json.dumps({"stdout": "hi"}))["run"]["stdout"] == "hi"
            with pytest.raises(Forbidden):
                tenant.tenants.list()  # not the admin key
            assert operator.keys.revoke(tenant_id, key["id"])["revoked_at"] is not None
            with pytest.raises(Unauthenticated):
                tenant.run("fake", "{}")
        with pytest.raises(NotFound):
            operator.keys.revoke("ten_nope", "key_nope")


def test_a_run_and_its_usage(url: str) -> None:
    with Corral(url, ADMIN_KEY) as operator:
        key = operator.tenants.create("runner")["key"]["api_key"]
    with Corral(url, key) as client:
        program = json.dumps({"stdout": "partial", "stderr": "oops", "exit": 3, "cpu_ms": 1500})
        result = client.run("fake", program, stdin="in", run_timeout=5, memory_limit_mb=128)
        assert result["status"] == "failed"  # the program's failure is a result
        assert result["run"]["exit_code"] == 3 and result["run"]["stderr"] == "oops"
        deadline = time.monotonic() + 10
        while (report := client.usage(group_by="tenant,language"))["total"]["events"] < 1:
            assert time.monotonic() < deadline, report
            time.sleep(0.05)
        assert report["rows"][0]["group"] == {"tenant": "runner", "language": "fake"}
        rows = list(csv.DictReader(io.StringIO(client.usage_csv(group_by="tenant,language"))))
        assert [row["tenant"] for row in rows] == ["runner", "total"]


def test_functions_register_list_and_invoke_errors(url: str) -> None:
    with Corral(url, ADMIN_KEY) as operator:
        key = operator.tenants.create("fn")["key"]["api_key"]
    with Corral(url, key) as client:
        first = client.functions.register("inc", code=CODE, manifest={"language": "python"})
        again = client.functions.register("inc", code=CODE, manifest={"language": "python"})
        assert first["created"] is True and again["created"] is False
        assert first["version"]["version"] == again["version"]["version"] == 1
        assert [f["name"] for f in client.functions.list()["functions"]] == ["inc"]
        with pytest.raises(NotFound):
            client.functions.invoke("missing", {})
        with pytest.raises(NotFound):
            client.functions.invoke("inc", {}, version="7")
        with pytest.raises(ValueError, match="exactly one of code and module"):
            client.functions.register("inc", manifest={"language": "python"})


async def test_the_async_client_has_the_same_calls(url: str) -> None:
    async with AsyncCorral(url, ADMIN_KEY) as operator:
        made = await operator.tenants.create("async-team")
        tenant_id = made["tenant"]["id"]
        assert (await operator.keys.create(tenant_id, name="k"))["tenant_id"] == tenant_id
        assert len((await operator.tenants.list())["tenants"]) == 1
    async with AsyncCorral(url, made["key"]["api_key"]) as client:
        result = await client.run("fake", json.dumps({"stdout": "ok"}))
        assert result["run"]["stdout"] == "ok"
        await client.functions.register("inc", code=CODE, manifest={"language": "python"})
        assert [f["name"] for f in (await client.functions.list())["functions"]] == ["inc"]
        with pytest.raises(NotFound):
            await client.functions.invoke("missing", {})
        assert "total" in await client.usage()
        assert (await client.usage_csv()).splitlines()[0].startswith("tenant,")
