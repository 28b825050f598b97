"""A bounded schemathesis run against ``/openapi.json``: every operation, with the admin
key and with a tenant key, a fixed seed. No answer may be a 5xx, and every answer must
conform to the document (status code, content type, headers, body schema).

schemathesis runs as its own CLI (``st run``) against a real server, as an operator would
run it; ``MAX_EXAMPLES`` keeps the whole test to about a minute here.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.app.api.v1.test_sandboxes import add_busybox
from tests.conftest import ADMIN, ADMIN_KEY, free_port

pytestmark = pytest.mark.slow

#: Test cases per operation and phase.
MAX_EXAMPLES = 20
SEED = 20260101
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
    ]
)


@pytest.fixture  # a test's own: a module-wide one would keep the four runs on one worker
def _st() -> Path:
    st = Path(sys.executable).parent / "st"
    if not st.exists():
        pytest.fail("schemathesis is not installed: `make .venv/.installed` (dev extras)")
    return st


@pytest.fixture
def api(live_server: Callable[..., str], stack: dict[str, Any], tmp_path: Path) -> str:
    """A server on the fake runtime and the fake sandbox backend (offered as crun too), with
    a keyless listener (as `make run` has it), embedded (SQLite) and cluster-shaped
    (PostgreSQL, whose text refuses NUL; Redis)."""
    add_busybox(tmp_path / "data" / "images", "python")
    return live_server(
        default_tenant="default",
        keyless_port=free_port(),
        sandbox_backends=["fake"],
        fake={"sandbox_aliases": {"crun": "fake"}},
        # the fuzzer's sandboxes are fakes: a node sized by this machine's 2 CPUs would be
        # full after two, and its 503 no_capacity (a true answer) would fail the run
        sandbox_cpu=4096.0,
        sandbox_memory_mb=1 << 24,
        **stack,
    )


def _tenant_key(api: str) -> str:
    created = httpx.post(f"{api}/v1/tenants", json={"name": "fuzzed"}, headers=ADMIN, timeout=30)
    assert created.status_code == 201, created.text
    key: str = created.json()["key"]["api_key"]
    functions = {"name": "echo", "language": "fake", "code": "{}"}
    httpx.post(
        f"{api}/v1/functions", json=functions, headers={"X-API-Key": key}, timeout=30
    )  # a function to find by name (fake is not a function language: refused, fine)
    return key


@pytest.mark.parametrize("who", ["admin", "tenant"])
def test_no_operation_answers_5xx_or_off_the_document(
    api: str, _st: Path, tmp_path: Path, who: str
) -> None:
    key = ADMIN_KEY if who == "admin" else _tenant_key(api)
    done = subprocess.run(
        [
            str(_st),
            "run",
            f"{api}/openapi.json",
            "--header",
            f"Authorization: Bearer {key}",
            "--checks",
            CHECKS,
            "--max-examples",
            str(MAX_EXAMPLES),
            "--seed",
            str(SEED),
            "--workers",
            "1",
            "--generation-database",
            "none",
            "--no-color",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    summary = done.stdout[-6000:]
    assert done.returncode == 0, f"schemathesis ({who} key) found failures:\n{summary}"
    assert "Tested: " in done.stdout, summary
