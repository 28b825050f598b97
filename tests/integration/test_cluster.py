"""The local cluster (deploy/cluster.py, what ``scripts/cluster`` runs): two gateways and
three nodes as real processes on real PostgreSQL and Redis. Work sent through either
gateway is spread over the nodes, run once, and visible through the other gateway; the
nodes never hold the database URL or the admin key; stopping (in code, by
``scripts/cluster stop`` or by Ctrl-C) leaves no process behind."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from deploy.cluster import Cluster, ProcessRecord, leftovers, read_state

pytestmark = [pytest.mark.integration, pytest.mark.redis, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cluster"
#: The fake backend (dev mode) keeps the cluster quick to start; everything else is real.
FAKE = {"CORRAL_DEV_MODE": "1"}
CALLS = 100


@pytest.fixture(autouse=True)
def _servers_installed() -> None:
    missing = [b for b in ("redis-server",) if shutil.which(b) is None]
    if not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")) and not shutil.which("initdb"):
        missing.append("initdb")
    if missing:
        if os.environ.get("CORRAL_TEST_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{missing} not installed (scripts/services.sh installs them)")
        pytest.skip(f"{missing} not installed (scripts/services.sh installs them)")


@pytest.fixture
def cluster_dir() -> Iterator[Path]:
    """A directory the postgres user can reach (pytest's tmp_path is closed to it)."""
    directory = Path(tempfile.mkdtemp(prefix="corral-cluster-test-"))
    try:
        yield directory
    finally:
        Cluster.stop_dir(directory)  # whatever a failed test left running
        shutil.rmtree(directory, ignore_errors=True)


def _logs(directory: Path) -> str:
    return "\n".join(
        f"----- {p.name} -----\n{p.read_text(errors='replace')[-3000:]}"
        for p in sorted((directory / "logs").glob("*.log"))
    )


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if item)


def _tenant(gateway: str, admin_key: str) -> dict[str, str]:
    created = httpx.post(
        f"{gateway}/v1/tenants",
        json={"name": "cluster", "quota": {"max_concurrent_executions": 128}},
        headers={"Authorization": f"Bearer {admin_key}"},
        timeout=30,
    )
    assert created.status_code == 201, created.text
    return {"Authorization": f"Bearer {created.json()['key']['api_key']}"}


async def _run_everywhere(gateways: list[str], headers: dict[str, str]) -> list[dict[str, Any]]:
    """CALLS runs at once, alternating between the gateways."""
    async with httpx.AsyncClient(timeout=120, headers=headers) as client:

        async def call(i: int) -> dict[str, Any]:
            program = {"stdout": f"call-{i}", "sleep": 0.05}
            response = await client.post(
                f"{gateways[i % len(gateways)]}/v1/run",
                json={"language": "fake", "code": json.dumps(program)},
            )
            assert response.status_code == 200, response.text
            return {"i": i, **response.json()}

        return await asyncio.gather(*(call(i) for i in range(CALLS)))


def _executions(health_url: str) -> float:
    metrics = httpx.get(health_url.replace("/healthz", "/metrics"), timeout=10).text
    pattern = r'^corral_node_executions_total\{[^}]*runtime="fake"[^}]*\} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, metrics, re.MULTILINE))


def test_work_through_both_gateways_is_spread_run_once_and_visible_everywhere(
    cluster_dir: Path,
) -> None:
    cluster = Cluster(cluster_dir, runtimes=["fake"], env=FAKE)
    records: list[ProcessRecord] = []
    try:
        info = cluster.start()
        records = list(cluster.records)
        assert len(info.gateways) == 2
        assert [n.id for n in info.nodes] == ["node-1", "node-2", "node-3"]
        for gateway in info.gateways:
            assert httpx.get(f"{gateway}/readyz", timeout=10).json()["nodes"] == 3

        # The planes apart: nodes get the Redis URL, never the database URL or admin key.
        for record in records:
            env = _environ(record.pid)
            if record.name.startswith("node-"):
                assert env["CORRAL_REDIS_URL"] == info.redis_url
                assert "CORRAL_DATABASE_URL" not in env and "CORRAL_ADMIN_KEY" not in env
            elif record.name.startswith("gateway-"):
                assert env["CORRAL_ADMIN_KEY"] == info.admin_key
                assert env["CORRAL_RUN_MIGRATIONS"] == "false"

        headers = _tenant(info.gateways[0], info.admin_key)
        results = asyncio.run(_run_everywhere(info.gateways, headers))

        assert len({r["invocation_id"] for r in results}) == CALLS
        used_nodes = set()
        for result in results:
            assert result["status"] == "succeeded", result
            assert result["attempts"] == 1
            assert result["run"]["stdout"] == f"call-{result['i']}"
            # Recorded once, in the shared database: the other gateway answers for it.
            other = info.gateways[(result["i"] + 1) % 2]
            stored = httpx.get(
                f"{other}/v1/invocations/{result['invocation_id']}", headers=headers, timeout=10
            )
            assert stored.status_code == 200, stored.text
            body = stored.json()
            assert body["status"] == "succeeded" and body["run"]["stdout"] == f"call-{result['i']}"
            assert body["node_id"] in {"node-1", "node-2", "node-3"}
            used_nodes.add(body["node_id"])
        assert len(used_nodes) > 1, f"all work ran on {used_nodes}"

        listed = httpx.get(
            f"{info.gateways[1]}/v1/invocations?limit=500", headers=headers, timeout=10
        ).json()["invocations"]
        assert len(listed) == CALLS

        executions = 0.0
        for node in info.nodes:
            health = httpx.get(node.health, timeout=10)
            assert health.status_code == 200, health.text
            assert health.json()["node_id"] == node.id and health.json()["status"] == "ok"
            executions += _executions(node.health)
        assert executions == CALLS  # each ran exactly once, somewhere

        # The check below is not vacuous: it sees every process while they run, and
        # PostgreSQL's backends (which leave its process group) too.
        running = set(leftovers(cluster_dir, records))
        assert {r.pid for r in records} < running
    except BaseException:
        print(_logs(cluster_dir))
        raise
    finally:
        cluster.stop()
    assert leftovers(cluster_dir, records) == []
    assert read_state(cluster_dir) is None
    cluster.stop()  # idempotent
    assert leftovers(cluster_dir, records) == []


def _script(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return subprocess.run(
        [str(SCRIPT), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_the_script_starts_prints_exports_and_stops_idempotently(cluster_dir: Path) -> None:
    common = ["--dir", str(cluster_dir)]
    started = _script(
        "start", *common, "--gateways", "1", "--nodes", "2", "--runtimes", '["fake"]',
        "--format", "env", **FAKE,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr + _logs(cluster_dir)
    exported = dict(
        line.removeprefix("export ").partition("=")[::2]
        for line in started.stdout.splitlines()
        if line.startswith("export ")
    )
    values = {k: shlex.split(v)[0] if v else "" for k, v in exported.items()}
    assert values["CORRAL_CLUSTER_DIR"] == str(cluster_dir.resolve())
    assert values["CORRAL_NODE_IDS"] == "node-1 node-2"
    assert len(values["CORRAL_ADMIN_KEY"]) >= 24
    state = read_state(cluster_dir)
    assert state is not None
    _info, records = state
    assert _script("status", *common).returncode == 0

    headers = _tenant(values["CORRAL_URL"], values["CORRAL_ADMIN_KEY"])
    ran = httpx.post(
        f"{values['CORRAL_URL']}/v1/run",
        json={"language": "fake", "code": '{"stdout": "ok"}'},
        headers=headers,
        timeout=60,
    )
    assert ran.status_code == 200 and ran.json()["status"] == "succeeded", ran.text

    stopped = _script("stop", *common)
    assert stopped.returncode == 0 and "stopped" in stopped.stderr
    assert leftovers(cluster_dir, records) == []
    again = _script("stop", *common)
    assert again.returncode == 0 and "nothing runs" in again.stderr
    assert _script("status", *common).returncode == 1


def test_ctrl_c_stops_a_cluster_in_the_foreground(cluster_dir: Path) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    argv = [str(SCRIPT), "up", "--dir", str(cluster_dir), "--gateways", "1", "--nodes", "1"]
    proc = subprocess.Popen(
        [*argv, "--runtimes", '["fake"]'],
        env={**base, **FAKE},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        printed = ""
        for line in proc.stdout:
            printed += line
            if line.rstrip() == "}":
                break
        info = json.loads(printed)
        state = read_state(cluster_dir)
        assert state is not None
        records = state[1]
        assert httpx.get(f"{info['gateways'][0]}/readyz", timeout=10).json()["nodes"] == 1

        proc.send_signal(signal.SIGINT)  # what Ctrl-C in its terminal sends
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        stderr = proc.stderr.read()
        proc.stderr.close()
    assert "stopped" in stderr, stderr
    assert leftovers(cluster_dir, records) == []
    assert read_state(cluster_dir) is None


def test_given_servers_are_used_and_left_running(
    cluster_dir: Path, postgres_url: str, redis_url: str
) -> None:
    cluster = Cluster(
        cluster_dir,
        gateways=1,
        nodes=1,
        runtimes=["fake"],
        env=FAKE,
        postgres_url=postgres_url,
        redis_url=redis_url,
    )
    records: list[ProcessRecord] = []
    try:
        info = cluster.start()
        records = list(cluster.records)
        assert {r.name for r in records} == {"gateway-1", "node-1"}
        assert info.postgres_url == postgres_url and info.redis_url == redis_url
        headers = _tenant(info.gateways[0], info.admin_key)
        ran = httpx.post(
            f"{info.gateways[0]}/v1/run",
            json={"language": "fake", "code": '{"stdout": "ok"}'},
            headers=headers,
            timeout=60,
        )
        assert ran.json()["status"] == "succeeded", ran.text
    except BaseException:
        print(_logs(cluster_dir))
        raise
    finally:
        cluster.stop()
    assert leftovers(cluster_dir, records) == []
    with redis.Redis.from_url(redis_url) as client:
        assert client.ping()  # not ours to stop
