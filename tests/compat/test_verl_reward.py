"""verl's SandboxFusion reward client, unchanged, scoring through Corral.

verl 0.9.1 is installed with ``--no-deps`` (``import verl`` pulls in torch), so its
``utils.py`` is loaded by path. Scores: True/False for a right/wrong answer, -4 compile
error, -2 runtime error, -3 time-out, -1 an API or sandbox failure.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.nsjail


@pytest.fixture(scope="module")
def verl_utils() -> ModuleType:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("verl is not installed: `make test` installs verl==0.9.1 --no-deps")
    path = Path(spec.submodule_search_locations[0]) / "utils/reward_score/sandbox_fusion/utils.py"
    module_spec = importlib.util.spec_from_file_location("verl_sandbox_fusion_utils", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def score(
    verl_utils: ModuleType,
    url: str,
    code: str,
    language: str = "python",
    inputs: list[str] | None = None,
    outputs: list[str] | None = None,
    timeout: int = 5,
) -> list[Any]:
    results, _meta = verl_utils.check_correctness(
        sandbox_fusion_url=f"{url}/run_code",
        in_outs={"inputs": inputs or ["2 3"], "outputs": outputs or ["5"]},
        generation=code,
        timeout=timeout,
        memory_limit_mb=1024,
        language=language,
    )
    return list(results)


ADD = "a, b = map(int, input().split())\nprint(a + b)"


def test_correct_answer_scores_true(verl_utils: ModuleType, sandbox_url: str) -> None:
    assert score(verl_utils, sandbox_url, ADD, inputs=["2 3", "10 -4"], outputs=["5", "6"]) == [
        True,
        True,
    ]


def test_wrong_answer_scores_false(verl_utils: ModuleType, sandbox_url: str) -> None:
    assert score(verl_utils, sandbox_url, "print(4)") == [False]


def test_compile_error_scores_minus_4(verl_utils: ModuleType, sandbox_url: str) -> None:
    assert score(verl_utils, sandbox_url, "int main( {", language="cpp") == [-4]


def test_runtime_error_scores_minus_2(verl_utils: ModuleType, sandbox_url: str) -> None:
    assert score(verl_utils, sandbox_url, "raise ValueError('boom')") == [-2]


def test_timeout_scores_minus_3(verl_utils: ModuleType, sandbox_url: str) -> None:
    assert score(verl_utils, sandbox_url, "while True: pass", timeout=1) == [-3]


def test_cpp_correct_answer(verl_utils: ModuleType, sandbox_url: str) -> None:
    code = '#include <cstdio>\nint main(){int a,b;scanf("%d %d",&a,&b);printf("%d\\n",a+b);}'
    assert score(verl_utils, sandbox_url, code, language="cpp") == [True]


@pytest.mark.slow
def test_a_burst_of_runaway_cases_is_judged_fairly(
    verl_utils: ModuleType, sandbox_url: str
) -> None:
    """verl's own high-load shape: 100 cases of a runaway program with a 10 s limit, sent
    as verl sends them (its pool of 32 workers, each request timing out after compile +
    run + 10 s = 30 s). Every case comes back TimeLimitExceeded (-3), none as an API
    failure (-1) because it waited past the client's timeout. And a correct program that
    needs about a CPU-second, sent two seconds into the burst, either succeeds or comes
    back flagged as contended: never as an unflagged time-out."""
    import httpx

    outcome: dict[str, Any] = {}

    def burst() -> None:
        started = time.monotonic()
        outcome["burst"] = verl_utils.check_correctness(
            sandbox_fusion_url=f"{sandbox_url}/run_code",
            in_outs={"inputs": [str(i) for i in range(100)], "outputs": ["x"] * 100},
            generation="while True: pass",
            timeout=10,
            memory_limit_mb=1024,
            language="python",
        )
        outcome["burst_seconds"] = time.monotonic() - started

    runner = threading.Thread(target=burst)
    runner.start()
    time.sleep(2)
    code = "n = 0\nfor i in range(12_000_000):\n    n += i\nprint(n)"
    probe = httpx.post(
        f"{sandbox_url}/run_code",
        json={"code": code, "language": "python", "run_timeout": 10},
        timeout=60,
    ).json()
    runner.join(300)
    results, metadata = outcome["burst"]
    failures = [m for r, m in zip(results, metadata, strict=True) if r != -3]
    assert not failures, failures[:3]
    assert len(results) == 100
    run = probe["run_result"]
    if probe["status"] == "Success":
        assert run["stdout"].strip() == str(sum(range(12_000_000)))
    else:
        assert run["status"] == "TimeLimitExceeded", probe
        assert run["contended"] is True, probe  # never an unflagged time-out
        assert run["cpu_time"] < 0.5 * run["execution_time"], probe
    print(
        f"100 runaway cases (10 s) as verl sends them: {outcome['burst_seconds']:.1f} s; "
        f"a 1-CPU-second program in the burst: {probe['status']} "
        f"({run['execution_time']:.1f} s, cpu {run['cpu_time']})"
    )


ALLOCATE = (
    "block = bytearray(600 * 1024 * 1024)\n"
    "block[::4096] = b'x' * len(block[::4096])  # touch every page\n"
    "a, b = map(int, input().split())\nprint(a + b)"
)


def test_verl_default_memory_limit_of_1024_mb_is_honoured(
    verl_utils: ModuleType, sandbox_url: str
) -> None:
    """verl asks for 1024 MB; a case that needs 600 MB of it passes, nothing capped."""
    import httpx

    assert score(verl_utils, sandbox_url, ALLOCATE) == [True]
    body = {"code": ALLOCATE, "language": "python", "stdin": "2 3", "memory_limit_MB": 1024}
    answer = httpx.post(f"{sandbox_url}/run_code", json=body, timeout=60).json()
    assert answer["status"] == "Success", answer
    assert answer["capped"] is None


def test_an_operator_cap_below_1024_mb_is_applied_and_said(live_server: Any) -> None:
    import httpx

    from tests.conftest import free_port, keyless_url

    port = free_port()
    live_server(
        runtimes=["nsjail"],
        default_tenant="default",
        keyless_port=port,
        quota={"max_memory_mb": 256},
    )
    body = {"code": ALLOCATE, "language": "python", "stdin": "2 3", "memory_limit_MB": 1024}
    answer = httpx.post(f"{keyless_url(port)}/run_code", json=body, timeout=60).json()
    assert answer["capped"] == {"memory_mb": {"requested": 1024, "granted": 256}}, answer
    assert answer["status"] == "Failed", answer  # 600 MB does not fit in 256
    assert "memory limit of 256 MB" in answer["message"], answer
