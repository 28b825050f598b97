"""The ``sandbox-fusion`` PyPI client, unchanged, against Corral's /run_code."""

from __future__ import annotations

import base64

import pytest
from sandbox_fusion import RunCodeRequest, RunStatus, run_code

pytestmark = pytest.mark.nsjail


def test_run_code_with_stdin(sandbox_url: str) -> None:
    request = RunCodeRequest(
        code="import sys\nprint(sys.stdin.read().upper(), end='')",
        language="python",
        stdin="hello corral",
    )
    response = run_code(request, endpoint=sandbox_url, max_attempts=1)
    assert response.status == RunStatus.Success
    assert response.run_result is not None
    assert response.run_result.stdout == "HELLO CORRAL"
    assert response.run_result.return_code == 0


def test_files_in_and_fetch_files_out(sandbox_url: str) -> None:
    data = base64.b64encode(b"3\n4\n").decode()
    request = RunCodeRequest(
        code=(
            "nums = [int(x) for x in open('input.txt').read().split()]\n"
            "open('out/sum.txt', 'w').write(str(sum(nums)))\n"
            "print('wrote')"
        ),
        language="python",
        files={"input.txt": data, "out/.keep": ""},
        fetch_files=["out/sum.txt"],
    )
    response = run_code(request, endpoint=sandbox_url, max_attempts=1)
    assert response.status == RunStatus.Success, response
    assert base64.b64decode(response.files["out/sum.txt"]) == b"7"


def test_time_limit(sandbox_url: str) -> None:
    request = RunCodeRequest(code="while True: pass", language="python", run_timeout=1)
    response = run_code(request, endpoint=sandbox_url, max_attempts=1)
    assert response.status == RunStatus.Failed
    assert response.run_result is not None
    assert response.run_result.status == "TimeLimitExceeded"


def test_cpp_compile_and_run(sandbox_url: str) -> None:
    code = "#include <iostream>\nint main(){int a,b;std::cin>>a>>b;std::cout<<a*b<<std::endl;}"
    request = RunCodeRequest(code=code, language="cpp", stdin="6 7")
    response = run_code(request, endpoint=sandbox_url, max_attempts=1)
    assert response.status == RunStatus.Success, response
    assert response.compile_result is not None and response.compile_result.return_code == 0
    assert response.run_result is not None and response.run_result.stdout.strip() == "42"


def test_cpp_compile_error(sandbox_url: str) -> None:
    request = RunCodeRequest(code="int main( { return 0; }", language="cpp")
    response = run_code(request, endpoint=sandbox_url, max_attempts=1)
    assert response.status == RunStatus.Failed
    assert response.compile_result is not None
    assert response.compile_result.return_code != 0
    assert "error" in (response.compile_result.stderr or "")
    assert response.run_result is None
