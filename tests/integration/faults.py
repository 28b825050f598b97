"""What the fault tests need: servers of their own to restart, a load to run around a
fault, and the invariants every fault must keep.

The invariants (``Ledger.check``), after the fault and a bounded grace:

* every invocation the API accepted (a call that was answered with its id) is final;
* nothing is left open, and no call made two rows;
* no execution ran more times than its ``attempts`` says (the fake backend logs each run);
* the rows are exactly the accepted calls, plus at most the calls that got no answer at
  all (a gateway killed while they were in flight).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from wire import keys

SERVICES_ROOT = Path("/var/tmp/corral-faults")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _workdir(kind: str) -> Path:
    path = SERVICES_ROOT / f"{kind}-{secrets.token_hex(4)}"
    path.mkdir(parents=True, mode=0o755)
    SERVICES_ROOT.chmod(0o755)
    return path


class PrivateRedis:
    """A redis-server of the test's own: restarting it loses everything (no persistence)."""

    def __init__(self) -> None:
        self.dir = _workdir("redis")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.dir / "redis.log").open("ab")
        self._proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        _wait_port(self.port)

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)
        self._proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def undelivered_jobs(self) -> int:
        """Jobs waiting in a stream that no node has read yet (a node reads only as many
        as it has free slots): what a restart of this Redis loses. Delivered entries
        do not count: their node holds them already."""
        import redis

        client = redis.Redis.from_url(self.url, decode_responses=True)
        try:
            waiting = 0
            for stream in client.scan_iter(match=f"{keys.PREFIX}:jobs:*", _type="stream"):
                groups = client.xinfo_groups(stream)
                if not groups:  # no node has read this stream yet
                    waiting += client.xlen(stream)
                waiting += sum(int(group.get("lag") or 0) for group in groups)
            return waiting
        finally:
            client.close()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivatePostgres:
    """A PostgreSQL cluster of the test's own, which the test may restart."""

    def __init__(self) -> None:
        self.dir = _workdir("pg")
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._bin = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._as_pg(f"{self._bin}/initdb -D {self.dir}/data -A trust -U postgres --no-sync")

    def _as_pg(self, command: str) -> None:
        argv = (
            ["su", "postgres", "-s", "/bin/sh", "-c", command]
            if os.geteuid() == 0
            else [
                "sh",
                "-c",
                command,
            ]
        )
        subprocess.run(argv, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        # Durable commits (fsync, synchronous_commit): the test restarts this server with
        # an immediate (crash) shutdown, and an acknowledged commit must survive it.
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=200"
        )
        self._as_pg(
            f"{self._bin}/pg_ctl -D {self.dir}/data -l {self.dir}/log -w -o '{options}' start"
        )

    def stop(self) -> None:
        self._as_pg(f"{self._bin}/pg_ctl -D {self.dir}/data -m immediate -w stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _wait_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.02)
    raise AssertionError(f"nothing listens on {port}")


# --- the load ---------------------------------------------------------------------------
@dataclass
class Call:
    tag: str
    status: int | None = None  #: HTTP status, None: no answer (connection failed)
    invocation_id: str | None = None
    body: Any = None
    error: str | None = None
    #: answered 503 with ``recorded: unknown``: the database failed mid-commit and did
    #: not come back in time, so a row may or may not exist
    unknown: bool = False


@dataclass
class Load:
    """``total`` calls of the fake language, ``concurrency`` at a time, spread over
    ``urls``, each sleeping ``sleep`` seconds on its node; runs in a thread."""

    urls: list[str]
    headers: dict[str, str]
    total: int = 300
    concurrency: int = 24
    sleep: float = 0.2
    timeout: float = 120.0
    calls: list[Call] = field(default_factory=list)
    _thread: threading.Thread | None = None

    def start(self) -> Load:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def wait_done(self, count: int, timeout: float = 120) -> None:
        """Until ``count`` calls were answered (or failed)."""
        deadline = time.monotonic() + timeout
        while sum(c.status is not None or c.error is not None for c in self.calls) < count:
            assert time.monotonic() < deadline, f"load stuck at {len(self.calls)} calls"
            time.sleep(0.02)

    def join(self) -> list[Call]:
        assert self._thread is not None
        self._thread.join(self.timeout + 60)
        assert not self._thread.is_alive(), "the load did not finish"
        return self.calls

    async def _run(self) -> None:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for n in range(self.total):
            queue.put_nowait(n)
        limits = httpx.Limits(max_connections=self.concurrency * len(self.urls))
        async with httpx.AsyncClient(timeout=self.timeout, limits=limits) as http:
            await asyncio.gather(*(self._worker(http, queue) for _ in range(self.concurrency)))

    async def _worker(self, http: httpx.AsyncClient, queue: asyncio.Queue[int]) -> None:
        while not queue.empty():
            n = queue.get_nowait()
            call = Call(tag=f"call-{n}")
            self.calls.append(call)
            url = self.urls[n % len(self.urls)]
            program = {"sleep": self.sleep, "stdout": call.tag}
            try:
                response = await http.post(
                    f"{url}/v1/run",
                    json={"language": "fake", "code": json.dumps(program), "run_timeout": 30},
                    headers=self.headers,
                )
            except httpx.HTTPError as exc:
                call.error = repr(exc)
                continue
            call.body = response.json()
            call.status = response.status_code
            if response.status_code == 200:
                call.invocation_id = call.body["invocation_id"]
            else:
                details = call.body.get("error", {}).get("details") or {}
                call.unknown = details.get("recorded") == "unknown"
                call.invocation_id = None if call.unknown else details.get("invocation_id")


# --- the record -------------------------------------------------------------------------
@dataclass
class Row:
    id: str
    status: str
    attempts: int
    error: str | None
    node_id: str | None
    tag: str


def read_rows(database_url: str) -> list[Row]:
    query = "SELECT id, status, attempts, error, node_id, request FROM invocations"
    if database_url.startswith("sqlite"):
        path = database_url.split("///", 1)[1]
        with sqlite3.connect(path) as conn:
            raw = conn.execute(query).fetchall()
    else:
        import asyncpg

        async def fetch() -> list[Any]:
            conn = await asyncpg.connect(database_url)
            try:
                return list(await conn.fetch(query))
            finally:
                await conn.close()

        raw = asyncio.run(fetch())
    rows = []
    for id_, status, attempts, error, node_id, request in raw:
        request = json.loads(request) if isinstance(request, str) else request
        tag = json.loads(request["code"]).get("stdout", "")
        rows.append(Row(id_, status, attempts, error, node_id, tag))
    return rows


def runs(run_log: Path) -> collections.Counter[str]:
    if not run_log.exists():
        return collections.Counter()
    return collections.Counter(run_log.read_text().split())


@dataclass
class Ledger:
    database_url: str
    run_log: Path

    def settle(self, timeout: float = 90) -> list[Row]:
        """Wait until no invocation is open (the bounded grace); the rows."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                rows = read_rows(self.database_url)
            except Exception:  # the database may be restarting
                rows = None
            if rows is not None and all(r.status not in ("queued", "running") for r in rows):
                return rows
            if time.monotonic() > deadline:
                still = [(r.id, r.status) for r in rows or [] if r.status in ("queued", "running")]
                raise AssertionError(f"still open after {timeout}s: {still}")
            time.sleep(0.25)

    def check(self, calls: list[Call], *, timeout: float = 90) -> dict[str, Any]:
        rows = self.settle(timeout)
        by_id = {r.id: r for r in rows}
        tags = collections.Counter(r.tag for r in rows)
        assert [t for t, n in tags.items() if n > 1] == [], "a call made two rows"
        accepted = [c for c in calls if c.invocation_id]
        missing = [c.invocation_id for c in accepted if c.invocation_id not in by_id]
        assert missing == [], f"accepted but not recorded: {missing[:5]}"
        for call in accepted:
            row = by_id[call.invocation_id or ""]
            assert row.tag == call.tag
            if call.status == 200:
                assert call.body["status"] == row.status, (call.body, row)
        unanswered = {c.tag for c in calls if c.status is None or c.unknown}
        extra = [r for r in rows if r.id not in {c.invocation_id for c in accepted}]
        assert all(r.tag in unanswered for r in extra), "rows no call asked for"
        assert len(rows) == len(accepted) + len(extra)
        ran = runs(self.run_log)
        over = {r.id: (ran[r.id], r.attempts) for r in rows if ran[r.id] > r.attempts}
        assert over == {}, f"ran more often than attempts says: {over}"
        answered_5xx = [c for c in calls if c.status is not None and c.status >= 500]
        assert all(c.status in (503, 504) for c in answered_5xx), [c.body for c in answered_5xx]
        return {
            "calls": len(calls),
            "accepted": len(accepted),
            "rows": len(rows),
            "succeeded": sum(r.status == "succeeded" for r in rows),
            "lost": sum((r.error or "").startswith("lost:") for r in rows),
            "reran": sum(r.attempts > 1 for r in rows),
            "ran_twice": sum(ran[r.id] > 1 for r in rows),
            "unanswered": len(unanswered),
            "unknown": sum(c.unknown for c in calls),
            "refused_503": sum(c.status == 503 for c in calls),
        }


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    os.killpg(proc.pid, sig)
    if sig in (signal.SIGKILL, signal.SIGTERM):
        proc.wait(30)
