"""CPython-on-WASI (the pre-initialised component, a fresh instance per call): behaviour,
limits and isolation between calls."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import Any

import pytest

from node.fncall.wasm import WasmBackend, pycomponent
from wire.execution import StageStatus
from wire.functions import PYTHON_DRIVER, python_call

RunFn = Callable[..., Any]

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_hello(runtime: WasmBackend, run: RunFn) -> None:
    result = await run(runtime, "print('hello', 6 * 7)")
    assert result.error is None
    assert result.run is not None and result.run.ok, result.run
    assert result.run.stdout == "hello 42\n"
    assert result.succeeded
    assert result.exec_ms > 0 and result.run.cpu_ms is not None


async def test_the_interpreter_is_the_pinned_cpython(runtime: WasmBackend, run: RunFn) -> None:
    result = await run(runtime, "import sys\nprint(sys.version.split()[0], sys.platform)")
    assert result.run is not None and result.run.ok, result.run
    assert result.run.stdout == f"{pycomponent.PYTHON_VERSION} wasi\n"


async def test_stdin(runtime: WasmBackend, run: RunFn) -> None:
    stdin = "first line\nsecond ünïcode line\n" + "x" * 200_000
    code = "import sys\nlines = sys.stdin.read().split('\\n')\nprint(lines[1], len(lines[2]))"
    result = await run(runtime, code, stdin=stdin)
    assert result.run is not None and result.run.ok, result.run
    assert result.run.stdout == "second ünïcode line 200000\n"


async def test_unread_stdin_does_not_block(runtime: WasmBackend, run: RunFn) -> None:
    result = await run(runtime, "print('ignored')", stdin="y" * 1_000_000)
    assert result.run is not None and result.run.ok, result.run


async def test_exception_exits_non_zero_with_traceback(runtime: WasmBackend, run: RunFn) -> None:
    code = "def boom():\n    raise ValueError('nope')\nboom()\n"
    result = await run(runtime, code)
    assert result.run is not None
    assert result.run.status is StageStatus.FINISHED
    assert result.run.exit_code == 1
    assert "Traceback (most recent call last)" in result.run.stderr
    assert 'File "main.py", line 2, in boom' in result.run.stderr
    assert "raise ValueError('nope')" in result.run.stderr  # source lines are shown
    assert "ValueError: nope" in result.run.stderr
    assert "<string>" not in result.run.stderr  # the bootstrap's frame is hidden


async def test_syntax_error(runtime: WasmBackend, run: RunFn) -> None:
    result = await run(runtime, "print(")
    assert result.run is not None and result.run.exit_code == 1
    assert "SyntaxError" in result.run.stderr


async def test_sys_exit_code(runtime: WasmBackend, run: RunFn) -> None:
    result = await run(runtime, "import sys\nprint('bye')\nsys.exit(3)")
    assert result.run is not None
    assert result.run.status is StageStatus.FINISHED
    assert result.run.exit_code == 3
    assert result.run.stdout == "bye\n"


async def test_sys_exit_message(runtime: WasmBackend, run: RunFn) -> None:
    result = await run(runtime, "raise SystemExit('fatal: no input')")
    assert result.run is not None and result.run.exit_code == 1
    assert result.run.stderr == "fatal: no input\n"


async def test_calls_do_not_share_state(runtime: WasmBackend, run: RunFn) -> None:
    first = await run(runtime, "import json\nSECRET = 42\njson.marker = 'x'\nprint('set')")
    assert first.run is not None and first.run.ok
    second = await run(
        runtime,
        "import json\nprint('SECRET' in globals(), hasattr(json, 'marker'))",
    )
    assert second.run is not None and second.run.ok, second.run
    assert second.run.stdout == "False False\n"


async def test_main_module_is_the_program(runtime: WasmBackend, run: RunFn) -> None:
    code = (
        "import __main__, pickle, sys\n"
        "class Point:\n    pass\n"
        "print(__name__, __main__.Point is Point, sys.argv, type(pickle.loads(pickle.dumps(Point()))).__name__)\n"  # noqa: E501
        "print(sorted(k for k in globals() if not k.startswith('__')))"
    )
    result = await run(runtime, code)
    assert result.run is not None and result.run.ok, result.run
    assert result.run.stdout.splitlines() == [
        "__main__ True ['main.py'] Point",
        "['Point', 'pickle', 'sys']",
    ]


async def test_files_and_fetch(runtime: WasmBackend, run: RunFn) -> None:
    code = (
        "import helper\n"
        "print(open('data/input.txt').read().strip(), helper.VALUE)\n"
        "print(open('/work/data/input.txt').read().strip())"
    )
    files = {"data/input.txt": b"from a file\n", "helper.py": b"VALUE = 7\n"}
    result = await run(runtime, code, files=files, fetch=["data/input.txt", "missing.txt"])
    assert result.run is not None and result.run.ok, result.run
    assert result.run.stdout == "from a file 7\nfrom a file\n"
    assert base64.b64decode(result.files["data/input.txt"]) == b"from a file\n"
    assert "missing.txt" not in result.files
    assert result.run.message and "missing.txt" in result.run.message


async def test_work_dir_is_read_only_and_host_is_hidden(runtime: WasmBackend, run: RunFn) -> None:
    code = (
        "import os\n"
        "try:\n    open('out.txt', 'w')\nexcept OSError as e:\n    print('write', type(e).__name__)\n"  # noqa: E501
        "for p in ('/etc/passwd', '/proc/self/environ', '../stdin'):\n"
        "    try:\n        open(p).read()\n        print(p, 'READABLE')\n"
        "    except OSError:\n        print(p, 'hidden')\n"
        "print(dict(os.environ))"
    )
    result = await run(runtime, code)
    assert result.run is not None and result.run.ok, result.run
    lines = result.run.stdout.splitlines()
    assert lines[0].startswith("write ")
    assert lines[1:4] == ["/etc/passwd hidden", "/proc/self/environ hidden", "../stdin hidden"]
    assert lines[4] == "{}"


async def test_bad_file_path_is_an_error_stage(runtime: WasmBackend, run: RunFn) -> None:
    result = await run(runtime, "print(1)", files={"../escape.txt": b"x"})
    assert result.error is None
    assert result.run is not None and result.run.status is StageStatus.ERROR
    assert result.run.message and "escape" in result.run.message
    clash = await run(runtime, "print(1)", files={"main.py": b"print(2)"})
    assert clash.run is not None and clash.run.status is StageStatus.ERROR
    assert clash.run.message and "main.py" in clash.run.message


async def test_infinite_loop_hits_time_limit(runtime: WasmBackend, run: RunFn) -> None:
    result = await run(runtime, "while True:\n    pass", run_timeout_s=1.0)
    assert result.run is not None
    assert result.run.status is StageStatus.TIME_LIMIT, result.run
    assert 0.9 * 1000 <= result.run.wall_ms <= 3 * 1000
    # the loop spun for the second it had, or was starved by other work and says so (a
    # loaded machine gave it 181 ms of CPU: flagged contended, as a verdict must be then)
    assert result.run.cpu_ms is not None
    assert result.run.cpu_ms > 300 or result.run.contended, result.run


async def test_sleep_is_cut_at_the_time_limit(runtime: WasmBackend, run: RunFn) -> None:
    code = "import time\nprint('start', flush=True)\ntime.sleep(3600)\nprint('woke')"
    result = await run(runtime, code, run_timeout_s=1.0)
    assert result.run is not None
    assert result.run.status is StageStatus.TIME_LIMIT, result.run
    assert 0.9 * 1000 <= result.run.wall_ms <= 3 * 1000
    assert result.run.stdout == "start\n"


async def test_short_sleep_and_clocks_work(runtime: WasmBackend, run: RunFn) -> None:
    code = (
        "import time\nt0, w0 = time.monotonic(), time.time()\ntime.sleep(0.05)\n"
        "print(0.04 < time.monotonic() - t0 < 1, abs(time.time() - w0) < 1)"
    )
    result = await run(runtime, code)
    assert result.run is not None and result.run.ok, result.run
    assert result.run.stdout == "True True\n"


async def test_memory_bomb_hits_memory_limit(runtime: WasmBackend, run: RunFn) -> None:
    result = await run(runtime, "x = bytearray(10**9)\nprint('allocated')", memory_mb=64)
    assert result.run is not None
    assert result.run.status is StageStatus.MEMORY_LIMIT, result.run
    assert "MemoryError" in result.run.stderr


async def test_gradual_memory_growth_hits_memory_limit(runtime: WasmBackend, run: RunFn) -> None:
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 20))"
    result = await run(runtime, code, memory_mb=48)
    assert result.run is not None
    assert result.run.status is StageStatus.MEMORY_LIMIT, result.run


async def test_output_flood_is_truncated(runtime: WasmBackend, run: RunFn) -> None:
    code = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)"
    result = await run(runtime, code, run_timeout_s=1.0, max_output_bytes=10_000)
    assert result.run is not None
    assert result.run.status is StageStatus.TIME_LIMIT
    assert result.run.stdout_truncated
    assert len(result.run.stdout) == 10_000
    assert not result.run.stderr_truncated


async def test_large_output_within_limit(runtime: WasmBackend, run: RunFn) -> None:
    result = await run(runtime, "print('y' * 300_000)", max_output_bytes=1_000_000)
    assert result.run is not None and result.run.ok
    assert len(result.run.stdout) == 300_001 and not result.run.stdout_truncated


async def test_deep_recursion_is_a_recursion_error(runtime: WasmBackend, run: RunFn) -> None:
    result = await run(runtime, "def f(n):\n    return f(n + 1)\nf(0)")
    assert result.run is not None
    assert result.run.status in (StageStatus.FINISHED, StageStatus.KILLED), result.run
    if result.run.status is StageStatus.FINISHED:
        assert "RecursionError" in result.run.stderr
    else:
        assert result.run.message and "stack" in result.run.message


async def test_pool_serves_concurrent_calls(runtime: WasmBackend, run: RunFn) -> None:
    results = await asyncio.gather(*(run(runtime, f"print({i} * 2)") for i in range(6)))
    assert [r.run.stdout if r.run else r.error for r in results] == [f"{i * 2}\n" for i in range(6)]
    assert set(runtime.stats()) == {"warm", "busy", "starting"}
    assert runtime.stats()["busy"] == 0


async def test_each_call_draws_its_own_random_numbers(runtime: WasmBackend, run: RunFn) -> None:
    """The snapshot holds a generator seeded at build time: each call reseeds it."""
    code = "import random\nprint(random.getrandbits(64))"
    draws = [await run(runtime, code) for _ in range(3)]
    values = {r.run.stdout for r in draws if r.run is not None and r.run.ok}
    assert len(values) == 3, draws


async def test_the_standard_library_that_was_preloaded_imports(
    runtime: WasmBackend, run: RunFn
) -> None:
    code = (
        "import fractions, decimal, statistics, heapq, datetime, csv, textwrap, hashlib\n"
        "print(fractions.Fraction(1, 3) + fractions.Fraction(1, 6), statistics.median([3, 1, 2]),"
        " hashlib.sha256(b'x').hexdigest()[:8], heapq.nsmallest(2, [5, 1, 4]))"
    )
    result = await run(runtime, code)
    assert result.run is not None and result.run.ok, result.run
    assert result.run.stdout == "1/2 2 2d711642 [1, 4]\n"


async def test_the_interpreters_own_sleep_is_refused(runtime: WasmBackend, run: RunFn) -> None:
    """``time.sleep`` is the host's (capped at the deadline); the interpreter's own sleep,
    reloaded by a guest, would block inside WASI: its audit event refuses it."""
    code = (
        "import sys\ndel sys.modules['time']\nimport time\n"
        "try:\n    time.sleep(30)\nexcept PermissionError as e:\n    print('refused', e)\n"
    )
    result = await run(runtime, code, run_timeout_s=2.0)
    assert result.run is not None and result.run.ok, result.run
    assert result.run.stdout.startswith("refused ")
    assert result.run.wall_ms < 1500


async def test_a_guest_blocked_in_select_is_answered_at_its_deadline(
    runtime: WasmBackend, run: RunFn
) -> None:
    """``select`` with a timeout waits inside WASI, where no deadline reaches it: the call
    is answered as a time limit once the host's backstop passes, and the guest's thread
    is counted as stuck until it ends."""
    code = "import select\nprint('in', flush=True)\nselect.select([], [], [], 10)\nprint('out')"
    result = await run(runtime, code, run_timeout_s=0.5)
    assert result.run is not None
    assert result.run.status is StageStatus.TIME_LIMIT, result.run
    assert result.run.message and "abandoned" in result.run.message
    assert result.run.wall_ms < 5000


async def test_the_function_driver_runs_compiled_from_the_snapshot(
    runtime: WasmBackend, run: RunFn
) -> None:
    """The tool-function driver is compiled into the snapshot (``pycomponent.PROGRAMS``):
    the guest holds its code object, and a call running it gets the function's answer."""
    probe = "import sys\nprint(sorted(sys.modules['corral_python']._COMPILED) == [DRIVER])"
    result = await run(runtime, f"DRIVER = {PYTHON_DRIVER!r}\n{probe}")
    assert result.run is not None and result.run.stdout == "True\n", result.run
    source = (
        "def handler(event):\n    print('adding')\n    return {'sum': event['a'] + event['b']}\n"
    )
    result = await run(
        runtime, PYTHON_DRIVER, stdin=python_call(source, "handler", {"a": 2, "b": 3})
    )
    assert result.run is not None and result.run.ok, result.run
    assert (result.run.stdout, result.run.stderr) == ('{"sum": 5}', "adding\n")
