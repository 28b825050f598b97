"""Shared fixtures.

``stack`` runs a test on the embedded stack (SQLite, in-process dispatch) and on the
cluster stack (PostgreSQL, Redis Streams). The servers are started by
``scripts/services.sh`` (``make test`` does it); without them the cluster cases skip,
unless CORRAL_TEST_REQUIRE_SERVICES=1, where they fail.

Migrations run once per test session (per xdist worker), not once per gateway: the
gateways of ``make_settings`` (so ``client``, ``live_server`` and every test that builds
its own) start on a copy of a migrated SQLite file, and the cluster case of ``stack`` on
a PostgreSQL database at head with empty tables (``tests/databases.py``: made once per
session, reset per test); the app then finds its schema at head in one query
(``app.db.migrate.at_head``). ``postgres_url`` is an empty database, for the tests of
migrations themselves and of processes that migrate.

The suite runs in parallel under pytest-xdist (``make test``: ``--dist loadgroup``):
each worker has its own Redis database and its own databases, and ``tests/groups.py``
keeps the tests that need something of the host's exclusively on one worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from node.settings import NodeSettings
from tests.databases import Databases, migrate, url_of
from tests.groups import assign_group, name_for_xdist
from tests.requirements import missing, require_crun, require_nsjail

ADMIN_KEY = "test-admin-key-" + "x" * 24
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _service_url(name: str) -> str:
    url = os.environ.get(name)
    if url:
        return url
    missing(f"{name} is not set (`make test` starts the servers with scripts/services.sh)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked ``nsjail`` need root and the nsjail binary, tests marked ``crun`` root,
    crun and corral-init: else they fail (or skip, outside ``make test``) before any of
    their fixtures start a jail or a container."""
    if item.get_closest_marker("nsjail") is not None:
        require_nsjail()
    if item.get_closest_marker("crun") is not None:
        require_crun()


def pytest_itemcollected(item: pytest.Item) -> None:
    """The group of tests this one must share a worker with, as soon as it is collected:
    xdist reads the groups in its own ``pytest_collection_modifyitems``, which may run
    before any of this conftest's."""
    assign_group(item)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker of ``--dist loadgroup``, after xdist's own hook: the ids that
    carry the groups to the scheduler (``tests.groups.name_for_xdist``)."""
    if getattr(config.option, "loadgroup", False):
        for item in items:
            name_for_xdist(item)


def worker_index() -> int:
    """This xdist worker's number (``gw3``: 3), or -1 outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else -1


@pytest.fixture(scope="session")
def databases() -> Iterator[Databases]:
    """This session's PostgreSQL databases (``tests/databases.py``), dropped at its end."""
    pool = Databases(_service_url("CORRAL_TEST_POSTGRES_URL"))
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def postgres_url(databases: Databases) -> Iterator[str]:
    """An empty PostgreSQL database, used by this test alone."""
    name = databases.acquire("empty")
    try:
        yield url_of(databases.server, name)
    finally:
        databases.release("empty", name)


@pytest.fixture
def migrated_postgres_url(databases: Databases) -> Iterator[str]:
    """A PostgreSQL database at head with empty tables, used by this test alone."""
    name = databases.acquire("migrated")
    try:
        yield url_of(databases.server, name)
    finally:
        databases.release("migrated", name)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database file migrated to head once for the session, for gateways'
    data dirs to start from a copy of (``make_settings``)."""
    import sqlite3

    path = tmp_path_factory.mktemp("sqlite-template") / "corral.db"
    asyncio.run(migrate(f"sqlite+aiosqlite:///{path}"))
    with contextlib.closing(sqlite3.connect(path)) as conn:  # all of it in the one file
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def _redis_for_worker(url: str) -> str:
    """Under xdist, worker N's own Redis database: the URL's database (0 if it names
    none) + N + 1, so that CI on database 0 uses 1, 2, ... and a session given 10 uses
    11, 12, ...; ``redis_url`` flushes its database, which must not be another worker's."""
    index = worker_index()
    if index < 0:
        return url
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    db = base + index + 1
    if db >= 16:  # Redis's default `databases`
        raise RuntimeError(f"xdist worker {index} would need Redis database {db} (of 0..15)")
    return urlunsplit(parts._replace(path=f"/{db}"))


@pytest.fixture
def redis_url() -> Iterator[str]:
    """The test Redis (this worker's database), flushed before and after."""
    import redis

    url = _redis_for_worker(_service_url("CORRAL_TEST_REDIS_URL"))
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()


#: Settings of the node agent a test gateway embeds (the rest are the gateway's).
NODE_ONLY = frozenset(NodeSettings.model_fields) - frozenset(Settings.model_fields)
#: Settings both planes have that are one thing when embedded (as one variable sets both).
SHARED = frozenset({"images_dir"})


def node_settings(data_dir: Path, **overrides: Any) -> NodeSettings:
    values: dict[str, Any] = {
        "dev_mode": True,
        "data_dir": data_dir,
        "runtimes": ["fake"],
        "heartbeat_seconds": 0.2,
        "node_dead_after_seconds": 1.0,
        "node_port": None,
    }
    return NodeSettings(**(values | overrides))


@pytest.fixture
def make_settings(tmp_path: Path, sqlite_template: Path) -> Callable[..., Settings]:
    """Gateway settings for tests; node-only settings (``runtimes``, ``node_slots``, ...)
    go to the embedded node's settings, shared ones (``images_dir``) to both; ``node``
    replaces the embedded node's settings whole.

    The default data dir (no ``data_dir``, no ``database_url``) gets a copy of the
    session's migrated database the first time, so its gateway does not run the
    migrations again; a data dir the test chooses is left as the test made it."""
    default_dir = tmp_path / "data"

    def make(**overrides: Any) -> Settings:
        node = {k: overrides.pop(k) for k in list(overrides) if k in NODE_ONLY}
        node |= {k: overrides[k] for k in SHARED & set(overrides)}
        data_dir = overrides.get("data_dir", default_dir)
        database = default_dir / "corral.db"
        default_db = data_dir == default_dir and not overrides.get("database_url")
        if default_db and not database.exists():
            default_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            shutil.copyfile(sqlite_template, database)
        values: dict[str, Any] = {
            "dev_mode": True,
            "admin_key": ADMIN_KEY,
            "data_dir": data_dir,
            "heartbeat_seconds": 0.2,
            "node_dead_after_seconds": 1.0,
            "reconcile_seconds": 0.2,
            "sandbox_sync_seconds": 0.2,
            "node": node_settings(data_dir, **node),
        }
        values.update(overrides)
        return Settings(**values)

    return make


@pytest.fixture(
    params=["embedded", pytest.param("cluster", marks=[pytest.mark.postgres, pytest.mark.redis])]
)
def stack(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Settings overrides for one deployment shape."""
    if request.param == "embedded":
        return {}
    return {
        "database_url": request.getfixturevalue("migrated_postgres_url"),
        "redis_url": request.getfixturevalue("redis_url"),
    }


@pytest.fixture
def client(make_settings: Callable[..., Settings], stack: dict[str, Any]) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(**stack))) as test_client:
        yield test_client


@pytest.fixture
def new_tenant(client: TestClient) -> Callable[..., dict[str, Any]]:
    """Create a tenant through the admin API; returns {"id", "key", "headers", ...}."""

    def make(name: str | None = None, **quota: Any) -> dict[str, Any]:
        body = {"name": name or "t-" + secrets.token_hex(4), "quota": quota}
        response = client.post("/v1/tenants", json=body, headers=ADMIN)
        assert response.status_code == 201, response.text
        data = response.json()
        key = data["key"]["api_key"]
        return {
            "id": data["tenant"]["id"],
            "key": key,
            "key_id": data["key"]["id"],
            "headers": {"Authorization": f"Bearer {key}"},
            "tenant": data["tenant"],
        }

    return make


def release_sandboxes(data_dir: Path) -> list[str]:
    """Destroy the containers a stopped server's node left (a node leaves its sandboxes
    running when it stops, for the next one to adopt) and their mounts; their ids."""
    import shutil
    import subprocess

    state = data_dir / "sandboxes" / ".state"
    crun = shutil.which("crun")
    if not state.is_dir() or crun is None:
        return []
    listed = subprocess.run(
        [crun, "--root", str(state), "list", "-q"], capture_output=True, text=True, check=False
    ).stdout.split()
    for container in listed:
        subprocess.run([crun, "--root", str(state), "delete", "-f", container], check=False)
    mine = str(data_dir.resolve()) + "/"
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f if line.split()[4].startswith(mine)]
    for point in sorted(points, reverse=True):
        subprocess.run(["umount", "-l", point], check=False)
    return listed


def keyless_url(port: int) -> str:
    """The base URL of a test server's keyless listener on ``port``."""
    return f"http://127.0.0.1:{port}"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def live_server(make_settings: Callable[..., Settings]) -> Iterator[Callable[..., str]]:
    """Start Corral on a real uvicorn server in a thread, configured as ``corral serve``
    configures it (``app.http.listeners.api_config``); returns the API's base URL.

    For clients that need a real socket (requests-based SDKs); ``port`` chooses its port
    (default: a free one). With ``keyless_port`` (and ``default_tenant``) the app also
    serves its keyless listener there: ``keyless_url(port)``.
    """
    import threading
    import time

    import uvicorn

    from app.http.listeners import api_config

    servers: list[tuple[uvicorn.Server, threading.Thread]] = []
    data_dirs: list[Path] = []

    def start(**overrides: Any) -> str:
        port = overrides.pop("port", None) or free_port()
        settings = make_settings(port=port, **overrides)
        server = uvicorn.Server(
            api_config(create_app(settings), settings, log_level="warning", lifespan="on")
        )
        thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
        thread.start()
        servers.append((server, thread))
        if settings.node.sandbox_backends:
            data_dirs.append(settings.data_dir)
        deadline = time.monotonic() + 60
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return f"http://127.0.0.1:{port}"

    try:
        yield start
    finally:
        for server, _thread in servers:
            server.should_exit = True
        for _server, thread in servers:
            thread.join(30)
        left = [found for data_dir in data_dirs for found in release_sandboxes(data_dir)]
        assert not left, f"the test left sandboxes running: {left}"


_OUTSIDE_SERVER = """
import socket, threading
def serve(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(64)
    while True:
        c, addr = s.accept(); c.sendall(f"hello-{port} from-{addr[0]}\\n".encode()); c.close()
for p in (8080, 8081):
    threading.Thread(target=serve, args=(p,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""


@pytest.fixture(scope="module")
def outside() -> Iterator[str]:
    """A host beyond this one, as a server on another machine would be: a network
    namespace of its own behind a veth (10.214.0.1 here, 10.214.0.2 there), serving
    "hello-<port> from-<peer address>" on TCP 8080 and 8081. Its address."""
    import subprocess
    import sys

    namespace, link = "corral-test-outside", "ctout0"

    def sh(*args: str, check: bool = True) -> None:
        subprocess.run(args, capture_output=True, check=check)

    sh("ip", "netns", "del", namespace, check=False)
    sh("ip", "link", "del", link, check=False)
    sh("ip", "netns", "add", namespace)
    server = None
    try:
        sh("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        sh("ip", "addr", "add", "10.214.0.1/30", "dev", link)
        sh("ip", "link", "set", link, "up")
        for command in (
            "addr add 10.214.0.2/30 dev eth0",
            "link set eth0 up",
            "link set lo up",
            "route add default via 10.214.0.1",
        ):
            sh("ip", "-n", namespace, *command.split())
        server = subprocess.Popen(
            ["ip", "netns", "exec", namespace, sys.executable, "-c", _OUTSIDE_SERVER],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield "10.214.0.2"
    finally:
        if server is not None:
            server.kill()
            server.wait()
            if server.stdout is not None:
                server.stdout.close()
        sh("ip", "netns", "del", namespace, check=False)
        sh("ip", "link", "del", link, check=False)
