"""Faults at the seams, for real: processes killed with SIGKILL or stopped with SIGSTOP,
Redis and PostgreSQL restarted, a result write failing, all while a few hundred calls
run. After each, the invariants of ``tests.integration.faults.Ledger.check``: every
accepted invocation ends final within its limits plus a bounded grace, nothing runs more
often than its ``attempts`` says, and the final rows are exactly the accepted calls
(plus, where a gateway was killed, calls that never got an answer)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN, ADMIN_KEY
from tests.integration.conftest import Procs, free_port, wait_ready
from tests.integration.faults import Ledger, Load, PrivatePostgres, PrivateRedis, read_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def cluster_env(database_url: str, redis_url: str, run_log: Path, **extra: str) -> dict[str, str]:
    return {
        "CORRAL_DEV_MODE": "1",
        "CORRAL_ADMIN_KEY": ADMIN_KEY,
        "CORRAL_DATABASE_URL": database_url,
        "CORRAL_REDIS_URL": redis_url,
        "CORRAL_RUNTIMES": '["fake"]',
        "CORRAL_FAKE": json.dumps({"run_log": str(run_log)}),
        "CORRAL_HEARTBEAT_SECONDS": "0.3",
        "CORRAL_NODE_DEAD_AFTER_SECONDS": "1.5",
        "CORRAL_RECONCILE_SECONDS": "0.3",
        "CORRAL_RECONCILE_GRACE_SECONDS": "2",
        "CORRAL_NODE_SLOTS": "12",
        "CORRAL_NODE_PORT": "0",
        "CORRAL_RESULT_WAIT_GRACE_SECONDS": "30",
        **extra,
    }


def gateway(procs: Procs, name: str, env: dict[str, str], **extra: str) -> str:
    port = free_port()
    procs.start(name, "gateway", "--port", str(port), **env, **extra)
    return f"http://127.0.0.1:{port}"


def node(procs: Procs, name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return procs.start(name, "node", **env, CORRAL_NODE_ID=name)


def tenant(url: str) -> dict[str, str]:
    body = {"name": "load", "quota": {"max_concurrent_executions": 512, "burst": 10_000}}
    created = httpx.post(f"{url}/v1/tenants", json=body, headers=ADMIN, timeout=30)
    assert created.status_code == 201, created.text
    return {"Authorization": f"Bearer {created.json()['key']['api_key']}"}


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)]
    return sum(values)


def report(name: str, stats: dict[str, Any]) -> None:
    print(f"\n{name}: {json.dumps(stats)}")


@pytest.mark.redis
@pytest.mark.postgres
def test_a_gateway_killed_between_commit_and_dispatch(
    corral_procs: Procs, postgres_url: str, redis_url: str, tmp_path: Path
) -> None:
    run_log = tmp_path / "runs.log"
    env = cluster_env(postgres_url, redis_url, run_log)
    doomed = gateway(
        corral_procs,
        "gw-doomed",
        env,
        CORRAL_FAILPOINTS='{"invocations.after_commit": "after:60:kill"}',
    )
    survivor = gateway(corral_procs, "gw-survivor", env)
    node(corral_procs, "node-a", env)
    wait_ready(doomed, nodes=1)
    wait_ready(survivor, nodes=1)
    headers = tenant(survivor)

    calls = Load([doomed, survivor], headers, total=300).start().join()

    assert corral_procs.running["gw-doomed"].poll() == -signal.SIGKILL
    stats = Ledger(postgres_url, run_log).check(calls)
    report("gateway killed", stats)
    # The call whose row was committed when the gateway died got no answer, and was
    # dispatched by the reconciler of the other gateway and run all the same.
    assert stats["rows"] > stats["accepted"] and stats["unanswered"] >= 1
    assert stats["succeeded"] == stats["rows"]


@pytest.mark.redis
@pytest.mark.postgres
def test_a_node_killed_mid_execution(
    corral_procs: Procs, postgres_url: str, redis_url: str, tmp_path: Path
) -> None:
    run_log = tmp_path / "runs.log"
    env = cluster_env(postgres_url, redis_url, run_log)
    url = gateway(corral_procs, "gw", env)
    node(corral_procs, "node-a", env)
    node(corral_procs, "node-b", env)
    wait_ready(url, nodes=2)
    # Twice the slots: node-a also dies holding overflow Jobs it read and never claimed.
    load = Load([url], tenant(url), total=300, sleep=0.5, concurrency=48).start()
    load.wait_done(80)
    corral_procs.kill("node-a")
    calls = load.join()

    stats = Ledger(postgres_url, run_log).check(calls)
    report("node killed", stats)
    assert stats["accepted"] == stats["calls"] == stats["rows"] == stats["succeeded"]
    assert stats["reran"] >= 1 and stats["lost"] == 0


@pytest.mark.redis
@pytest.mark.postgres
def test_a_result_write_that_fails_once(
    corral_procs: Procs, postgres_url: str, redis_url: str, tmp_path: Path
) -> None:
    run_log = tmp_path / "runs.log"
    env = cluster_env(postgres_url, redis_url, run_log)
    url = gateway(
        corral_procs,
        "gw",
        env,
        CORRAL_FAILPOINTS='{"recorder.before_commit": "after:40:raise-once"}',
    )
    node(corral_procs, "node-a", env)
    wait_ready(url, nodes=1)

    calls = Load([url], tenant(url), total=300).start().join()

    stats = Ledger(postgres_url, run_log).check(calls)
    report("write fails once", stats)
    assert stats["accepted"] == stats["calls"] == stats["succeeded"]
    assert stats["reran"] == 0  # a failed write is retried, not re-run
    assert metric(url, 'corral_recorder_events_total{outcome="retried"}') >= 1


@pytest.mark.postgres
def test_redis_restarted_without_persistence_mid_load(
    corral_procs: Procs,
    postgres_url: str,
    private_redis: PrivateRedis,
    tmp_path: Path,
) -> None:
    run_log = tmp_path / "runs.log"
    env = cluster_env(postgres_url, private_redis.url, run_log)
    url = gateway(corral_procs, "gw", env)
    node(corral_procs, "node-a", env)
    node(corral_procs, "node-b", env)
    wait_ready(url, nodes=2)
    # Twice the slots: some Jobs wait in the streams when Redis loses them.
    load = Load([url], tenant(url), total=300, concurrency=48).start()
    load.wait_done(100)
    # restart while Jobs wait in the streams, unread (the case under test: the nodes may
    # have read every entry at a given moment, and a queued row may be one a node holds
    # already, so wait for an unread entry rather than assume it)
    deadline = time.monotonic() + 30
    while private_redis.undelivered_jobs() == 0:
        assert time.monotonic() < deadline, "no Job ever waited unread in a stream"
        time.sleep(0.02)
    private_redis.restart()
    calls = load.join()

    stats = Ledger(postgres_url, run_log).check(calls)
    report("redis restarted", stats)
    assert stats["accepted"] >= 100 and stats["reran"] >= 1
    # And work flows again afterwards.
    after = Load([url], load.headers, total=20).start().join()
    assert all(c.status == 200 for c in after), [
        c.body or c.error for c in after if c.status != 200
    ]


@pytest.mark.redis
def test_postgres_restarted_mid_load(
    corral_procs: Procs,
    redis_url: str,
    private_postgres: PrivatePostgres,
    tmp_path: Path,
) -> None:
    run_log = tmp_path / "runs.log"
    env = cluster_env(private_postgres.url, redis_url, run_log)
    url = gateway(corral_procs, "gw", env)
    node(corral_procs, "node-a", env)
    wait_ready(url, nodes=1)
    load = Load([url], tenant(url), total=300).start()
    load.wait_done(100)
    private_postgres.restart()
    calls = load.join()

    stats = Ledger(private_postgres.url, run_log).check(calls)
    report("postgres restarted", stats)
    assert stats["accepted"] >= 100
    after = Load([url], load.headers, total=20).start().join()
    assert all(c.status == 200 for c in after), [
        c.body or c.error for c in after if c.status != 200
    ]


@pytest.mark.redis
@pytest.mark.postgres
def test_a_node_that_stalls_past_the_dead_node_timeout_then_finishes(
    corral_procs: Procs, postgres_url: str, redis_url: str, tmp_path: Path
) -> None:
    run_log = tmp_path / "runs.log"
    env = cluster_env(postgres_url, redis_url, run_log)
    url = gateway(corral_procs, "gw", env)
    stalling = node(corral_procs, "node-a", env)
    node(corral_procs, "node-b", env)
    wait_ready(url, nodes=2)
    load = Load([url], tenant(url), total=200, sleep=1.0).start()
    load.wait_done(40)
    # stall it while it runs something (the case under test; placement decides where
    # each call goes, so wait for the moment rather than assume it)
    deadline = time.monotonic() + 30
    while not any(r.status == "running" and r.node_id == "node-a" for r in read_rows(postgres_url)):
        assert time.monotonic() < deadline, "node-a never ran anything"
        time.sleep(0.05)
    stalling.send_signal(signal.SIGSTOP)
    time.sleep(1.5 + 2 + 1.5)  # dead after 1.5 s; the reconciler hands its work out again
    stalling.send_signal(signal.SIGCONT)  # ... and it finishes what it held
    calls = load.join()

    stats = Ledger(postgres_url, run_log).check(calls)
    report("node stalled", stats)
    assert stats["accepted"] == stats["calls"] == stats["succeeded"]
    assert stats["reran"] >= 1 and stats["ran_twice"] >= 1  # and attempts says so (checked)


def test_an_embedded_server_killed_with_work_in_flight_and_started_again(
    corral_procs: Procs, tmp_path: Path
) -> None:
    run_log = tmp_path / "runs.log"
    data = tmp_path / "data"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        "CORRAL_DEV_MODE": "1",
        "CORRAL_ADMIN_KEY": ADMIN_KEY,
        "CORRAL_DATA_DIR": str(data),
        "CORRAL_RUNTIMES": '["fake"]',
        "CORRAL_FAKE": json.dumps({"run_log": str(run_log)}),
        "CORRAL_RECONCILE_SECONDS": "0.3",
        "CORRAL_RECONCILE_GRACE_SECONDS": "1",
        "CORRAL_NODE_SLOTS": "12",
    }
    corral_procs.start("serve", "serve", "--port", str(port), **env)
    wait_ready(url, nodes=1)
    load = Load([url], tenant(url), total=300, sleep=0.3).start()
    load.wait_done(100)
    corral_procs.kill("serve")
    time.sleep(0.5)
    corral_procs.start("serve-again", "serve", "--port", str(port), **env)
    calls = load.join()
    wait_ready(url, nodes=1)

    stats = Ledger(f"sqlite:///{data}/corral.db", run_log).check(calls)
    report("embedded killed", stats)
    assert stats["rows"] > stats["accepted"]  # work in flight when it died ...
    assert stats["succeeded"] == stats["rows"]  # ... was run after the restart
