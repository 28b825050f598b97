"""The host side of the control channel against a fake nsjail that misbehaves: every
protocol violation is a platform error with a clear message, and the jail is dropped."""

from __future__ import annotations

import asyncio
import pathlib
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import pytest_asyncio

from node.fncall.nsjail import NsjailBackend

pytestmark = pytest.mark.asyncio(loop_scope="module")

RunFn = Callable[..., Coroutine[Any, Any, Any]]

# Stands in for nsjail: starts a child (the "zygote" the host pins and kills), greets
# like the zygote, then breaks the protocol as told. It never runs what it is given.
FAKE = """#!{python}
import json, os, struct, subprocess, sys, threading
MODE = {mode!r}
if MODE == "no-ready":
    sys.stderr.write("nsjail: Couldn't initialize cgroup for the jail\\n")
    sys.exit(255)
child = subprocess.Popen(
    ["/bin/sleep", "300"],
    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
threading.Thread(target=lambda: (child.wait(), os._exit(137)), daemon=True).start()
def send(obj):
    body = json.dumps(obj).encode()
    sys.stdout.buffer.write(struct.pack(">I", len(body)) + body)
    sys.stdout.buffer.flush()
def recv():
    size = struct.unpack(">I", sys.stdin.buffer.read(4))[0]
    return json.loads(sys.stdin.buffer.read(size))
send({{"op": "ready", "pid": 1, "vm_bytes": 0, "python": "3.11.2"}})
request = recv()
if MODE == "garbage":
    sys.stdout.buffer.write(b"\\xff\\xff\\xff\\xff" + b"x" * 64)
elif MODE == "bad-json":
    sys.stdout.buffer.write(struct.pack(">I", 5) + b"{{nop}}")
elif MODE == "wrong-id":
    send({{"op": "result", "id": "someone-else", "stages": []}})
elif MODE == "exit":
    sys.stderr.write("zygote: Traceback (most recent call last): boom\\n")
    sys.stderr.flush()
    child.kill()
    os._exit(1)
elif MODE == "silent":
    pass
sys.stdout.buffer.flush()
child.wait()
"""


@pytest_asyncio.fixture(loop_scope="module")
async def fake_runtime(tmp_path: pathlib.Path, new_runtime: Callable[..., NsjailBackend]) -> Any:
    runtimes: list[NsjailBackend] = []

    async def make(mode: str, **overrides: Any) -> NsjailBackend:
        script = tmp_path / f"fake-nsjail-{mode}"
        script.write_text(FAKE.format(python=sys.executable, mode=mode))
        script.chmod(0o755)
        rt = new_runtime(
            languages=["python"],
            nsjail_path=str(script),
            cgroups="off",
            require_cgroups=False,
            host_grace_s=1.0,
            start_timeout_s=5.0,
            **overrides,
        )
        runtimes.append(rt)
        await rt.start()
        return rt

    yield make
    for rt in runtimes:
        await rt.close()


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("garbage", "frame"),
        ("bad-json", "malformed JSON"),
        ("wrong-id", "unexpected reply"),
        ("exit", "died"),
        ("silent", "did not answer"),
    ],
)
async def test_protocol_violations_are_platform_errors(
    run: RunFn, fake_runtime: Any, mode: str, expected: str
) -> None:
    rt: NsjailBackend = await fake_runtime(mode)
    assert rt.pool is not None
    [jail] = rt.pool.workers()
    result = await run(rt, "print(1)", run_timeout_s=1.0)
    assert result.error is not None and expected in result.error, result.error
    assert result.run is None
    await asyncio.sleep(0)  # let the background kill run
    assert jail not in rt.pool.workers()
    if mode == "exit":
        assert "boom" in result.error  # the zygote's last words are in the message


async def test_start_failure_names_the_cause(
    fake_runtime: Any,
) -> None:
    with pytest.raises(Exception, match="Couldn't initialize cgroup"):
        await fake_runtime("no-ready")
