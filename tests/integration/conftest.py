"""Real Corral processes for integration tests.

``corral_procs`` starts ``corral`` subcommands as child processes, each in its own
process group with its log in a file; at teardown every one is killed and reaped, and
the logs are printed when the test failed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.integration.faults import PrivatePostgres, PrivateRedis

CORRAL = [sys.executable, "-m", "app"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Procs:
    logdir: Path
    env: dict[str, str]
    running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        log = (self.logdir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [*CORRAL, *args],
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.running[name] = proc
        return proc

    def kill(self, name: str) -> None:
        proc = self.running.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop_all(self) -> None:
        for name in list(self.running):
            proc = self.running.pop(name)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)

    def logs(self) -> str:
        return "\n".join(
            f"----- {p.name} -----\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.logdir.glob("*.log"))
        )


@pytest.fixture
def corral_procs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Procs]:
    logdir = tmp_path / "logs"
    logdir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    procs = Procs(logdir, env)
    try:
        yield procs
    finally:
        procs.stop_all()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(procs.logs())


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    setattr(item, f"rep_{report.when}", report)  # type: ignore[attr-defined]
    return report


def wait_ready(url: str, *, nodes: int = 0, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{url}/readyz", timeout=2)
            last = response.text
            if response.status_code == 200 and response.json()["nodes"] >= nodes:
                return
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.1)
    raise AssertionError(f"{url} not ready with {nodes} nodes: {last}")


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    """A Redis of the test's own, started; the test may restart it (losing everything)."""
    redis = PrivateRedis()
    try:
        redis.start()
        yield redis
    finally:
        redis.close()


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A PostgreSQL cluster of the test's own, started; the test may restart it."""
    postgres = PrivatePostgres()
    try:
        postgres.start()
        yield postgres
    finally:
        postgres.close()
