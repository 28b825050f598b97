"""Functions really running: Python on nsjail, wasm-python, wasm-javascript and C
compiled to a WASI module, through the HTTP API (sync, async + poll, batch), and the
ways a function can fail.

One app per backend for the whole module (starting wasm compiles CPython once).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.conftest import ADMIN, ADMIN_KEY, node_settings
from tests.requirements import require_tool
from wire.messages import Job

REPO = Path(__file__).resolve().parents[4]
INTERPRETERS = Path(os.environ.get("CORRAL_DATA_DIR", REPO / "var")) / "wasm" / "interpreters"
EXAMPLES = REPO / "functions"

WORD_COUNT = (EXAMPLES / "word-count" / "handler.py").read_text()
SLUGIFY = (EXAMPLES / "slugify" / "slugify.js").read_text()


def _client(tmp: Path, runtimes: list[str]) -> Iterator[TestClient]:
    settings = Settings(
        dev_mode=True,
        admin_key=ADMIN_KEY,
        data_dir=tmp,
        node=node_settings(
            tmp,
            runtimes=runtimes,
            wasm={"interpreters_dir": str(INTERPRETERS), "warm_per_language": 1},
            nsjail={"warm_per_language": 1},
        ),
    )
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture(scope="module")
def wasm_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    yield from _client(tmp_path_factory.mktemp("fn-wasm"), ["wasm"])


@pytest.fixture(scope="module")
def jail_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    yield from _client(tmp_path_factory.mktemp("fn-jail"), ["nsjail"])


def _tenant(client: TestClient) -> dict[str, str]:
    response = client.post("/v1/tenants", json={"name": f"t-{time.monotonic_ns()}"}, headers=ADMIN)
    assert response.status_code == 201, response.text
    return {"Authorization": f"Bearer {response.json()['key']['api_key']}"}


def _register(client: TestClient, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    response = client.post("/v1/functions", json=body, headers=headers)
    assert response.status_code in (200, 201), response.text
    return dict(response.json())


def _invoke(
    client: TestClient, headers: dict[str, str], name: str, value: Any, path: str = "/invoke"
) -> dict[str, Any]:
    response = client.post(f"/v1/functions/{name}{path}", json=value, headers=headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


def _compile_c(tmp_path: Path, source: str) -> str:
    clang = require_tool("clang", "scripts/setup-wasm.sh")
    src = tmp_path / "f.c"
    src.write_text(source)
    out = tmp_path / "f.wasm"
    subprocess.run(
        [clang, "--target=wasm32-wasi", "-O2", "-o", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    return base64.b64encode(out.read_bytes()).decode()


@pytest.mark.nsjail
def test_python_on_nsjail(jail_client: TestClient) -> None:
    headers = _tenant(jail_client)
    _register(jail_client, headers, name="wc", language="python", code=WORD_COUNT)
    result = _invoke(jail_client, headers, "wc", {"text": "a b a\nc", "top": 1})
    assert result["status"] == "succeeded", result
    assert result["output"] == {"words": 4, "lines": 2, "top": [["a", 2]]}
    assert "counted 4 words" in result["logs"]
    assert result["error"] is None
    assert result["version"] == 1


@pytest.mark.nsjail
def test_python_failures_on_nsjail(jail_client: TestClient) -> None:
    headers = _tenant(jail_client)
    code = (
        "import sys, time\n"
        "def handler(input):\n"
        "    if input == 'raise':\n"
        "        return 1 / 0\n"
        "    if input == 'garbage':\n"
        "        sys.__stdout__.write('not json')\n"
        "    if input == 'set':\n"
        "        return {1, 2}\n"
        "    if input == 'sleep':\n"
        "        time.sleep(30)\n"
        "    return input\n"
    )
    _register(jail_client, headers, name="f", language="python", code=code, limits={"timeout_s": 1})
    raised = _invoke(jail_client, headers, "f", "raise")
    assert raised["status"] == "failed"
    assert raised["error"]["code"] == "function_error"
    assert "ZeroDivisionError" in raised["error"]["message"]
    assert 'File "<function>", line 4' in raised["logs"]
    garbage = _invoke(jail_client, headers, "f", "garbage")
    assert garbage["status"] == "failed"
    assert garbage["error"]["code"] == "bad_function_output"
    not_json = _invoke(jail_client, headers, "f", "set")
    assert not_json["error"]["code"] == "function_error"
    assert "not JSON serializable" in not_json["error"]["message"]
    slow = _invoke(jail_client, headers, "f", "sleep")
    assert slow["status"] == "failed"
    assert slow["error"]["code"] == "time_limit"
    assert _invoke(jail_client, headers, "f", [1])["output"] == [1]


@pytest.mark.nsjail
def test_nodejs_on_nsjail(jail_client: TestClient) -> None:
    headers = _tenant(jail_client)
    _register(jail_client, headers, name="slug", language="nodejs", code=SLUGIFY)
    result = _invoke(jail_client, headers, "slug", {"title": "Héllo, World!"})
    assert result["status"] == "succeeded", result
    assert result["output"] == {"slug": "hello-world"}
    assert "slug of" in result["logs"]


def test_wasm_python(wasm_client: TestClient) -> None:
    headers = _tenant(wasm_client)
    _register(wasm_client, headers, name="wc", language="wasm-python", code=WORD_COUNT)
    result = _invoke(wasm_client, headers, "wc", {"text": "x y x", "top": 1})
    assert result["status"] == "succeeded", result
    assert result["output"] == {"words": 3, "lines": 1, "top": [["x", 2]]}
    assert "counted 3 words" in result["logs"]


def test_wasm_javascript(wasm_client: TestClient) -> None:
    headers = _tenant(wasm_client)
    _register(wasm_client, headers, name="slug", language="wasm-javascript", code=SLUGIFY)
    result = _invoke(wasm_client, headers, "slug", {"title": "  Hello, World! "})
    assert result["status"] == "succeeded", result
    assert result["output"] == {"slug": "hello-world"}
    assert "slug of" in result["logs"]
    code = (
        "const handler = async (input) => { if (input.boom) throw new Error('boom'); "
        "return input.a * 2; };"
    )
    _register(wasm_client, headers, name="dbl", language="wasm-javascript", code=code)
    assert _invoke(wasm_client, headers, "dbl", {"a": 21})["output"] == 42
    failed = _invoke(wasm_client, headers, "dbl", {"boom": True})
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "function_error"
    assert "boom" in failed["logs"]


def test_c_to_wasm(wasm_client: TestClient, tmp_path: Path) -> None:
    headers = _tenant(wasm_client)
    module = _compile_c(tmp_path, (EXAMPLES / "fib-c" / "fib.c").read_text())
    _register(
        wasm_client,
        headers,
        name="fib",
        language="wasm",
        module_base64=module,
        input_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
    )
    result = _invoke(wasm_client, headers, "fib", {"n": 50})
    assert result["status"] == "succeeded", result
    assert result["output"] == {"n": 50, "fib": 12586269025}
    assert "fib(50) computed" in result["logs"]
    # The Job names the module by digest: the row and the dispatch carry no bytes, and the
    # node fetched the module once (the worker keeps it compiled by the same digest).
    digest = hashlib.sha256(base64.b64decode(module)).hexdigest()
    services = wasm_client.app.state.services  # type: ignore[attr-defined]
    jobs: list[str] = []
    dispatch = services.transport.dispatch

    async def watched(job: Job, **kwargs: Any) -> None:
        jobs.append(job.model_dump_json())
        await dispatch(job, **kwargs)

    services.transport.dispatch = watched
    try:
        again = _invoke(wasm_client, headers, "fib", {"n": 10})
    finally:
        services.transport.dispatch = dispatch
    assert again["output"] == {"n": 10, "fib": 55}
    (job,) = jobs
    assert json.loads(job)["spec"]["artifact"] == digest
    assert json.loads(job)["spec"]["files"] == {} and len(job) < 2_000, job
    assert services.node.backends["wasm"].artifacts.fetched == 1


def test_wasm_module_failures_leave_the_server_healthy(
    wasm_client: TestClient, tmp_path: Path
) -> None:
    headers = _tenant(wasm_client)
    source = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
    char buf[64] = {0};
    fread(buf, 1, sizeof buf - 1, stdin);
    if (strstr(buf, "loop")) { volatile unsigned long i = 0; for (;;) i++; }
    if (strstr(buf, "grow")) {
        for (;;) {
            volatile char *p = malloc(1 << 20);
            if (!p) { fprintf(stderr, "oom\n"); return 1; }
            p[0] = 1;
        }
    }
    if (strstr(buf, "text")) { printf("hello, not json\n"); return 0; }
    if (strstr(buf, "exit")) { fprintf(stderr, "bad input\n"); return 3; }
    printf("\"ok\"\n");
    return 0;
}
"""
    _register(
        wasm_client,
        headers,
        name="bad",
        language="wasm",
        module_base64=_compile_c(tmp_path, source),
        limits={"timeout_s": 1, "memory_mb": 32},
    )
    loop = _invoke(wasm_client, headers, "bad", "loop")
    assert loop["status"] == "failed"
    assert loop["error"]["code"] == "time_limit"
    grow = _invoke(wasm_client, headers, "bad", "grow")
    assert grow["status"] == "failed"
    assert grow["error"]["code"] == "memory_limit", grow
    text = _invoke(wasm_client, headers, "bad", "text")
    assert text["error"]["code"] == "bad_function_output"
    exited = _invoke(wasm_client, headers, "bad", "exit")
    assert exited["error"]["code"] == "function_error"
    assert exited["error"]["details"]["exit_code"] == 3
    assert "bad input" in exited["error"]["message"]
    assert _invoke(wasm_client, headers, "bad", "fine")["output"] == "ok"
    assert wasm_client.get("/healthz").status_code == 200


def test_versions_and_aliases_route_invocations(wasm_client: TestClient) -> None:
    headers = _tenant(wasm_client)
    for n in (1, 2):
        code = f"function handler(input) {{ return {n}; }}"
        _register(wasm_client, headers, name="v", language="wasm-javascript", code=code)
    put = wasm_client.put("/v1/functions/v/aliases/stable", json={"version": 1}, headers=headers)
    assert put.status_code == 200
    assert _invoke(wasm_client, headers, "v", 0)["output"] == 2
    assert _invoke(wasm_client, headers, "v", 0, "/invoke?version=1")["output"] == 1
    pinned = _invoke(wasm_client, headers, "v", 0, "/versions/stable/invoke")
    assert (pinned["output"], pinned["version"]) == (1, 1)
    assert _invoke(wasm_client, headers, "v", 0, "/versions/2/invoke")["output"] == 2


def test_async_invoke_and_poll(wasm_client: TestClient) -> None:
    headers = _tenant(wasm_client)
    _register(wasm_client, headers, name="slug", language="wasm-javascript", code=SLUGIFY)
    response = wasm_client.post(
        "/v1/functions/slug/invoke",
        json={"title": "Async Call"},
        headers=headers | {"Prefer": "respond-async"},
    )
    assert response.status_code == 202, response.text
    assert response.headers["Preference-Applied"] == "respond-async"
    accepted = response.json()
    invocation_id = accepted["invocation_id"]
    deadline = time.monotonic() + 30
    while True:
        record = wasm_client.get(accepted["poll"], headers=headers).json()
        if record["status"] not in ("queued", "running"):
            break
        assert time.monotonic() < deadline, record
        time.sleep(0.05)
    assert record["status"] == "succeeded"
    assert record["kind"] == "function"
    result = wasm_client.get(accepted["result"], headers=headers).json()
    assert result["invocation_id"] == invocation_id
    assert result["output"] == {"slug": "async-call"}
    other = _tenant(wasm_client)
    assert wasm_client.get(accepted["result"], headers=other).status_code == 404
    assert wasm_client.get(accepted["poll"], headers=other).status_code == 404


def test_batch(wasm_client: TestClient) -> None:
    headers = _tenant(wasm_client)
    _register(
        wasm_client,
        headers,
        name="sq",
        language="wasm-javascript",
        code="function handler(x) { if (x === 3) throw new Error('three'); return x * x; }",
        input_schema={"type": "integer"},
    )
    response = wasm_client.post(
        "/v1/functions/sq/invoke/batch", json={"inputs": [1, 2, "x", 3, 4]}, headers=headers
    )
    assert response.status_code == 200, response.text
    items = response.json()["results"]
    assert [i["result"]["output"] if i["result"] else None for i in items] == [1, 4, None, None, 16]
    assert items[2]["error"]["code"] == "input_validation_error"
    assert items[3]["result"]["error"]["code"] == "function_error"
