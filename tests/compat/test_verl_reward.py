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
def test_burst_of_time_limits_at_concurrency_32(verl_utils: ModuleType, sandbox_url: str) -> None:
    """100 time-limit cases, 32 at once, as verl sends them: every one comes back as
    TimeLimitExceeded (-3), none as a client time-out or a 429 (-1)."""
    semaphore = threading.Semaphore(32)
    started = time.monotonic()
    results, metadata = verl_utils.check_correctness(
        sandbox_fusion_url=f"{sandbox_url}/run_code",
        in_outs={"inputs": [str(i) for i in range(100)], "outputs": ["x"] * 100},
        generation="while True: pass",
        timeout=1,
        memory_limit_mb=1024,
        language="python",
        concurrent_semaphore=semaphore,
    )
    elapsed = time.monotonic() - started
    failures = [m for r, m in zip(results, metadata, strict=True) if r != -3]
    assert not failures, failures[:3]
    assert len(results) == 100
    print(f"100 time-limit cases at concurrency 32: {elapsed:.1f} s")
