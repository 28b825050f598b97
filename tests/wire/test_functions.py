"""The Python tool-function driver, run by a plain CPython: the call on stdin, the
result alone on stdout, the function's prints on stderr, failures as exit code 1."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from wire.functions import PYTHON_DRIVER, python_call

SOURCE = """\
import asyncio

def handler(event):
    print("adding", event)
    return {"sum": event["a"] + event["b"]}

async def later(event):
    await asyncio.sleep(0)
    return [event]

def broken(event):
    return 1 / 0

value = 3
"""


def call(entry: str, value: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PYTHON_DRIVER],
        input=python_call(SOURCE, entry, value),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_result_alone_on_stdout_and_prints_on_stderr() -> None:
    done = call("handler", {"a": 2, "b": 3})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"sum": 5}
    assert done.stderr == "adding {'a': 2, 'b': 3}\n"


def test_a_coroutine_entry_point_is_awaited() -> None:
    done = call("later", None)
    assert (done.returncode, json.loads(done.stdout)) == (0, [None])


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("broken", 'File "<function>", line 12, in broken'),
        ("value", "corral: entry point 'value' is not a function"),
        ("missing", "corral: entry point 'missing' is not a function"),
    ],
)
def test_a_failure_exits_1_with_its_reason_on_stderr(entry: str, message: str) -> None:
    done = call(entry, {})
    assert done.returncode == 1 and done.stdout == ""
    assert message in done.stderr


def test_the_program_is_the_same_for_every_function() -> None:
    """The function travels on stdin: a runtime can keep the program compiled."""
    assert "handler" not in PYTHON_DRIVER
    assert json.loads(python_call("x = 1", "f", [1])) == {
        "source": "x = 1",
        "entry": "f",
        "input": [1],
    }
