"""A local Corral cluster of real processes on this machine: a private PostgreSQL and
Redis (or given URLs), one ``corral db upgrade``, two ``corral gateway`` and three
``corral node`` processes sharing a strong admin key. ``scripts/cluster`` drives it; tests
and benchmarks import it.

    scripts/cluster start [--dir DIR] [--gateways 2] [--nodes 3] [--runtimes JSON]
                          [--format json|env]      # start, print, leave it running
    scripts/cluster stop [--dir DIR]               # stop everything it started (idempotent)
    scripts/cluster up ...                         # start, print, stop on Ctrl-C/SIGTERM
    scripts/cluster status [--dir DIR]

Every process runs in its own process group with its log in ``DIR/logs``; the state file
``DIR/cluster.json`` (mode 0600: it holds the admin key) names each one by pid and start
time, so ``stop`` never signals a process that merely reuses a pid. Nodes get the Redis URL
and never the database URL or the admin key. PostgreSQL runs with ``fsync=off``: this is a
test bed, not a place to keep data.

In code::

    with Cluster(runtimes=["fake"], env={"CORRAL_DEV_MODE": "1"}) as cluster:
        cluster.info.gateways        # ["http://127.0.0.1:PORT", ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pwd
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

import httpx
import redis

from wire import keys
from wire.messages import NodeReport

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = Path("/var/tmp/corral-cluster")
DEFAULT_RUNTIMES = ("nsjail", "wasm")
STATE_FILE = "cluster.json"
#: Settings the cluster sets itself; the caller's values of these are not passed on.
MANAGED = frozenset(
    {
        "CORRAL_DATABASE_URL",
        "CORRAL_REDIS_URL",
        "CORRAL_ADMIN_KEY",
        "CORRAL_HOST",
        "CORRAL_PORT",
        "CORRAL_RUN_MIGRATIONS",
        "CORRAL_DATA_DIR",
        "CORRAL_NODE_ID",
        "CORRAL_NODE_HOST",
        "CORRAL_NODE_PORT",
        "CORRAL_RUNTIMES",
        "CORRAL_CLUSTER_DIR",
    }
)
#: What a node must never be given.
NOT_FOR_NODES = frozenset({"CORRAL_DATABASE_URL", "CORRAL_ADMIN_KEY"})
#: Client-side variables of the `corral` CLI and of this tool: never passed to servers.
CLIENT_ONLY = ("CORRAL_URL", "CORRAL_API_KEY", "CORRAL_GATEWAY_URLS", "CORRAL_NODE_IDS")


class ClusterError(RuntimeError):
    """The cluster could not be started (the message says which process and why)."""


# --- processes -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcessRecord:
    """A process the cluster started: the leader of its own process group."""

    name: str
    pid: int
    start_time: int  #: /proc/<pid>/stat field 22: tells our process from a reused pid
    stop_signal: int = signal.SIGTERM
    log: str = ""


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time) of a process, or None when there is none."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()
    return fields[0], int(fields[2]), int(fields[19])


def _running(record: ProcessRecord) -> bool:
    """Our process is still there and not a zombie waiting to be reaped."""
    stat = _stat(record.pid)
    return stat is not None and stat[0] != "Z" and stat[2] == record.start_time


def _live_processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent, process group) of every process that is not a zombie."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            data = (entry / "stat").read_text()
            fields = data[data.rindex(")") + 2 :].split()
            if fields[0] != "Z":
                found[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return found


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    return [pid for pid, (_, group) in _live_processes().items() if group == pgid]


def _descendants(pids: set[int]) -> set[int]:
    """Live descendants of ``pids`` (PostgreSQL's backends leave its process group)."""
    processes = _live_processes()
    found: set[int] = set()
    frontier = set(pids)
    while frontier:
        frontier = {p for p, (parent, _) in processes.items() if parent in frontier} - found
        found |= frontier
    return found


def _our_group(record: ProcessRecord) -> list[int]:
    """Live members of the process group ``record`` leads. A pid in use as a process group
    id is never handed out again, so while the leader's pid is free or still ours, the
    group's members are ours; once another process holds that pid, the group is not."""
    stat = _stat(record.pid)
    if stat is not None and stat[2] != record.start_time:
        return []
    return _group_members(record.pid)


def processes_using(directory: Path) -> list[int]:
    """Live processes whose command line or environment names ``directory``: what a
    cluster there left behind (everything it starts carries ``CORRAL_CLUSTER_DIR``)."""
    needle = str(directory.resolve()).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        stat = _stat(int(entry.name))
        if stat is None or stat[0] == "Z":
            continue
        for part in ("cmdline", "environ"):
            with contextlib.suppress(OSError):
                if needle in (entry / part).read_bytes():
                    found.append(int(entry.name))
                    break
    return found


def leftovers(directory: Path, records: Sequence[ProcessRecord]) -> list[int]:
    """Every live process of the cluster: in one of its process groups, or naming its dir."""
    pids = set(processes_using(directory))
    for record in records:
        pids.update(_our_group(record))
    ours = {r.pid for r in records if _running(r)}
    return sorted(pids | ours | _descendants(ours | pids))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- what the cluster is ---------------------------------------------------------------------
@dataclass
class NodeInfo:
    id: str
    health: str  #: the node's /healthz URL


@dataclass
class ClusterInfo:
    """What ``start`` prints and the state file keeps."""

    dir: str
    gateways: list[str] = field(default_factory=list)
    nodes: list[NodeInfo] = field(default_factory=list)
    admin_key: str = ""
    postgres_url: str = ""
    redis_url: str = ""
    logs: str = ""

    def as_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def as_env(self) -> str:
        values = {
            "CORRAL_CLUSTER_DIR": self.dir,
            "CORRAL_URL": self.gateways[0] if self.gateways else "",
            "CORRAL_GATEWAY_URLS": " ".join(self.gateways),
            "CORRAL_NODE_IDS": " ".join(n.id for n in self.nodes),
            "CORRAL_ADMIN_KEY": self.admin_key,
            "CORRAL_CLUSTER_POSTGRES_URL": self.postgres_url,
            "CORRAL_CLUSTER_REDIS_URL": self.redis_url,
        }
        return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in values.items())


def _write_state(directory: Path, info: ClusterInfo, records: list[ProcessRecord]) -> None:
    state = {"info": asdict(info), "processes": [asdict(r) for r in records]}
    path = directory / STATE_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f, indent=2)
    os.replace(tmp, path)


def read_state(directory: Path) -> tuple[ClusterInfo, list[ProcessRecord]] | None:
    try:
        state = json.loads((directory / STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    raw = state["info"]
    info = ClusterInfo(**{**raw, "nodes": [NodeInfo(**n) for n in raw["nodes"]]})
    return info, [ProcessRecord(**r) for r in state["processes"]]


# --- the cluster -----------------------------------------------------------------------------
class Cluster:
    """Start with ``start()`` (or ``with``); ``stop()`` ends every process it started.

    ``env`` holds extra ``CORRAL_*`` settings for every gateway and node (never the ones the
    cluster sets itself; nodes never get the database URL or the admin key). Without
    ``postgres_url`` / ``redis_url`` private servers are started under ``directory``.
    """

    def __init__(
        self,
        directory: Path | None = None,
        *,
        gateways: int = 2,
        nodes: int = 3,
        runtimes: Sequence[str] = DEFAULT_RUNTIMES,
        postgres_url: str | None = None,
        redis_url: str | None = None,
        admin_key: str | None = None,
        env: Mapping[str, str] | None = None,
        node_prefix: str = "node",
        ready_timeout: float = 180.0,
        python: str = sys.executable,
    ) -> None:
        if gateways < 1 or nodes < 1:
            raise ValueError("a cluster needs at least one gateway and one node")
        self.dir = (
            Path(directory) if directory else Path(tempfile.mkdtemp(prefix="corral-cluster-"))
        )
        self.gateway_count = gateways
        self.node_ids = [f"{node_prefix}-{i}" for i in range(1, nodes + 1)]
        self.runtimes = list(runtimes)
        self.ready_timeout = ready_timeout
        self.python = python
        self.env = {k: v for k, v in (env or {}).items() if k not in MANAGED}
        self.info = ClusterInfo(
            dir=str(self.dir.resolve()),
            admin_key=admin_key or secrets.token_urlsafe(32),
            postgres_url=postgres_url or "",
            redis_url=redis_url or "",
            logs=str(self.dir.resolve() / "logs"),
        )
        self.records: list[ProcessRecord] = []
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._own_postgres = postgres_url is None
        self._own_redis = redis_url is None

    # --- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> ClusterInfo:
        """Start everything and wait until both gateways count every node; on any failure
        (or Ctrl-C) stop what was started and raise."""
        self._prepare_dir()
        try:
            if self._own_redis:
                self.info.redis_url = self._start_redis()
            if self._own_postgres:
                self.info.postgres_url = self._start_postgres()
            self._migrate()
            for i in range(1, self.gateway_count + 1):
                self.info.gateways.append(self._start_gateway(i))
            for i, node_id in enumerate(self.node_ids, 1):
                self._start_node(i, node_id)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        _write_state(self.dir, self.info, self.records)
        return self.info

    def stop(self) -> None:
        """Stop every process this cluster started: the planes first (nodes drain), then
        Redis and PostgreSQL. Idempotent."""
        _stop_all(self.records, self._children)
        self._children.clear()
        if self.records:  # the state file is ours (not another cluster's in this dir)
            (self.dir / STATE_FILE).unlink(missing_ok=True)

    @classmethod
    def stop_dir(cls, directory: Path) -> list[ProcessRecord]:
        """Stop the cluster whose state is in ``directory`` (started by another process).
        Returns what it stopped; nothing when nothing runs there."""
        state = read_state(directory)
        if state is None:
            return []
        _info, records = state
        _stop_all(records, {})
        (directory / STATE_FILE).unlink(missing_ok=True)
        return records

    # --- pieces --------------------------------------------------------------------------------
    def _prepare_dir(self) -> None:
        state = read_state(self.dir)
        if state is not None:
            if any(_running(r) for r in state[1]):
                raise ClusterError(f"a cluster already runs in {self.dir}: stop it first")
            (self.dir / STATE_FILE).unlink()
        self.dir.mkdir(parents=True, exist_ok=True)
        # Traversable by the postgres user, not listable by anyone else.
        self.dir.chmod(0o711)
        (self.dir / "logs").mkdir(exist_ok=True)

    def _base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env["PYTHONPATH"] = str(ROOT)
        env["CORRAL_CLUSTER_DIR"] = self.info.dir  # marks every process of this cluster
        return env

    def _spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        stop_signal: int = signal.SIGTERM,
        user: str | None = None,
    ) -> subprocess.Popen[bytes]:
        log_path = self.dir / "logs" / f"{name}.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                list(argv),
                env=dict(env),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **_as_user(user),
            )
        stat = _stat(proc.pid)
        record = ProcessRecord(
            name, proc.pid, stat[2] if stat else 0, int(stop_signal), str(log_path)
        )
        self.records.append(record)
        self._children[proc.pid] = proc
        _write_state(self.dir, self.info, self.records)  # stoppable even if start dies
        return proc

    def _check_alive(self) -> None:
        for record in self.records:
            proc = self._children.get(record.pid)
            if proc is not None and proc.poll() is not None:
                raise ClusterError(
                    f"{record.name} exited with {proc.returncode}:\n{_tail(record.log)}"
                )

    def _wait(self, what: str, ready: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if ready():
                    return
            except Exception as exc:  # not up yet
                last = repr(exc)
            time.sleep(0.1)
        raise ClusterError(f"{what} not ready after {timeout:.0f} s {last}")

    def _start_redis(self) -> str:
        server = shutil.which("redis-server")
        if server is None:
            raise ClusterError("redis-server not found (scripts/services.sh installs it)")
        directory = self.dir / "redis"
        directory.mkdir(exist_ok=True)
        port = free_port()
        argv = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", str(directory), "--logfile", ""]
        self._spawn("redis", argv, self._base_env())
        url = f"redis://127.0.0.1:{port}/0"

        def pong() -> bool:
            with redis.Redis.from_url(url, socket_timeout=1) as client:
                return bool(client.ping())

        self._wait("redis", pong, 30)
        return url

    def _start_postgres(self) -> str:
        bindir = _postgres_bindir()
        user = "postgres" if os.geteuid() == 0 else None
        directory = self.dir / "postgres"
        directory.mkdir(mode=0o700, exist_ok=True)
        if user is not None:
            account = pwd.getpwnam(user)
            os.chown(directory, account.pw_uid, account.pw_gid)
            _check_traversable(directory, account.pw_uid)
        data = directory / "data"
        initdb = [str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]
        with (self.dir / "logs" / "initdb.log").open("ab") as log:
            done = subprocess.run(
                [*initdb, "--no-sync", "-E", "UTF8"],
                env=self._base_env(),
                cwd=directory,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
                **_as_user(user),
            )
        if done.returncode != 0:
            raise ClusterError(f"initdb failed:\n{_tail(self.dir / 'logs' / 'initdb.log')}")
        port = free_port()
        argv = [str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-k", ""]
        for option in (
            "listen_addresses=127.0.0.1",
            "max_connections=200",
            "fsync=off",
            "synchronous_commit=off",
            "full_page_writes=off",
        ):
            argv += ["-c", option]
        # SIGINT is PostgreSQL's fast shutdown (SIGTERM waits for every client to leave).
        self._spawn("postgres", argv, self._base_env(), stop_signal=signal.SIGINT, user=user)
        server = f"postgresql://postgres@127.0.0.1:{port}"
        self._wait("postgresql", lambda: asyncio.run(_create_database(server, "corral")), 60)
        return f"{server}/corral"

    def _gateway_env(self, name: str, port: int) -> dict[str, str]:
        return {
            **self._base_env(),
            **self.env,
            "CORRAL_DATABASE_URL": self.info.postgres_url,
            "CORRAL_REDIS_URL": self.info.redis_url,
            "CORRAL_ADMIN_KEY": self.info.admin_key,
            "CORRAL_HOST": "127.0.0.1",
            "CORRAL_PORT": str(port),
            "CORRAL_RUN_MIGRATIONS": "false",
            "CORRAL_DATA_DIR": str(self.dir / name),
        }

    def _migrate(self) -> None:
        log_path = self.dir / "logs" / "migrate.log"
        with log_path.open("ab") as log:
            done = subprocess.run(
                [self.python, "-m", "app", "db", "upgrade"],
                env=self._gateway_env("migrate", 0),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=300,
                check=False,
            )
        if done.returncode != 0:
            raise ClusterError(f"corral db upgrade failed:\n{_tail(log_path)}")

    def _start_gateway(self, i: int) -> str:
        port = free_port()
        argv = [self.python, "-m", "app", "gateway", "--port", str(port)]
        self._spawn(f"gateway-{i}", argv, self._gateway_env(f"gateway-{i}", port))
        return f"http://127.0.0.1:{port}"

    def _node_env(self, i: int, node_id: str) -> dict[str, str]:
        env = {k: v for k, v in self.env.items() if k not in NOT_FOR_NODES}
        wasm: dict[str, Any] = {}
        interpreters = ROOT / "var" / "wasm" / "interpreters"  # scripts/setup-wasm.sh
        if interpreters.is_dir():
            wasm["interpreters_dir"] = str(interpreters)
        wasm.update(json.loads(env.pop("CORRAL_WASM", "{}")))
        return {
            **{k: v for k, v in self._base_env().items() if k not in NOT_FOR_NODES},
            **env,
            "CORRAL_REDIS_URL": self.info.redis_url,
            "CORRAL_NODE_ID": node_id,
            "CORRAL_NODE_HOST": "127.0.0.1",
            "CORRAL_NODE_PORT": "0",
            "CORRAL_RUNTIMES": json.dumps(self.runtimes),
            "CORRAL_DATA_DIR": str(self.dir / f"node-{i}"),
            "CORRAL_WASM": json.dumps(wasm),
        }

    def _start_node(self, i: int, node_id: str) -> None:
        self._spawn(node_id, [self.python, "-m", "app", "node"], self._node_env(i, node_id))

    def _wait_ready(self) -> None:
        nodes: dict[str, NodeInfo] = {}

        def reports() -> bool:
            with redis.Redis.from_url(self.info.redis_url, decode_responses=True) as client:
                values = client.mget([keys.node(i) for i in self.node_ids])
            for node_id, value in zip(self.node_ids, values, strict=True):
                report = NodeReport.model_validate_json(value) if value else None
                if report is None or not report.address:
                    return False
                nodes[node_id] = NodeInfo(node_id, f"http://{report.address}/healthz")
            return True

        def healthy() -> bool:
            for gateway in self.info.gateways:
                response = httpx.get(f"{gateway}/readyz", timeout=5)
                if response.status_code != 200 or response.json()["nodes"] < len(self.node_ids):
                    return False
            return all(httpx.get(n.health, timeout=5).status_code == 200 for n in nodes.values())

        self._wait("node reports", reports, self.ready_timeout)
        self._wait("gateways and nodes", healthy, self.ready_timeout)
        self.info.nodes = [nodes[i] for i in self.node_ids]


STORES = ("redis", "postgres")


def _stop_all(
    records: Sequence[ProcessRecord], children: Mapping[int, subprocess.Popen[bytes]]
) -> None:
    """The planes first (nodes drain, gateways store what they hold), then the stores."""
    _stop([r for r in records if r.name not in STORES], children, grace=30.0)
    _stop([r for r in records if r.name in STORES], children, grace=15.0)


def _stop(
    records: Sequence[ProcessRecord],
    children: Mapping[int, subprocess.Popen[bytes]],
    *,
    grace: float,
) -> None:
    """Signal each process group, wait up to ``grace`` seconds, then SIGKILL what is left
    of the groups; children of ours are reaped."""
    for record in records:
        if _running(record):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, record.stop_signal)
    deadline = time.monotonic() + grace
    for record in records:
        while _running(record) and time.monotonic() < deadline:
            proc = children.get(record.pid)
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
            else:
                time.sleep(0.05)
    for record in records:
        # The group outlives its leader only in processes it left (jails, backends).
        if _running(record) or _our_group(record):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, signal.SIGKILL)
        proc = children.get(record.pid)
        if proc is not None:
            proc.wait(timeout=10)
    for record in records:
        end = time.monotonic() + 10
        while _our_group(record) and time.monotonic() < end:
            time.sleep(0.05)


def _as_user(user: str | None) -> dict[str, Any]:
    if user is None:
        return {}
    account = pwd.getpwnam(user)
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def _postgres_bindir() -> Path:
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
    for bindir in reversed(candidates):
        if (bindir / "initdb").exists():
            return bindir
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise ClusterError("PostgreSQL's initdb not found (scripts/services.sh installs it)")


def _check_traversable(path: Path, uid: int) -> None:
    for parent in path.resolve().parents:
        mode = parent.stat()
        if mode.st_uid != uid and not mode.st_mode & 0o001:
            raise ClusterError(
                f"the postgres user cannot reach {path} ({parent} is closed to it): "
                "choose a directory under /tmp or /var/tmp"
            )


async def _create_database(server: str, name: str) -> bool:
    import asyncpg  # type: ignore[import-untyped]

    conn = await asyncpg.connect(f"{server}/postgres", timeout=2)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if not exists:
            await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return True


def _tail(path: str | Path, size: int = 3000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-size:]
    except OSError:
        return "(no log)"


# --- the command -----------------------------------------------------------------------------
def _caller_settings() -> dict[str, str]:
    """The caller's CORRAL_* settings to pass on (CORRAL_DEV_MODE, CORRAL_NODE_SLOTS, ...)."""
    return {
        k: v
        for k, v in os.environ.items()
        if k.startswith("CORRAL_")
        and k not in MANAGED
        and k not in CLIENT_ONLY
        and not k.startswith(("CORRAL_CLUSTER_", "CORRAL_TEST_"))
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/cluster", description=(__doc__ or "").splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    directory = argparse.ArgumentParser(add_help=False)
    directory.add_argument(
        "--dir",
        type=Path,
        default=Path(os.environ.get("CORRAL_CLUSTER_DIR", DEFAULT_DIR)),
        help=f"state, logs and private servers (CORRAL_CLUSTER_DIR, default {DEFAULT_DIR})",
    )
    starting = argparse.ArgumentParser(add_help=False)
    starting.add_argument("--gateways", type=int, default=2)
    starting.add_argument("--nodes", type=int, default=3)
    starting.add_argument(
        "--runtimes",
        default=os.environ.get("CORRAL_RUNTIMES", json.dumps(list(DEFAULT_RUNTIMES))),
        help='backends of every node, as JSON (default ["nsjail", "wasm"])',
    )
    starting.add_argument(
        "--postgres-url",
        default=os.environ.get("CORRAL_CLUSTER_POSTGRES_URL"),
        help="use this database instead of a private PostgreSQL",
    )
    starting.add_argument(
        "--redis-url",
        default=os.environ.get("CORRAL_CLUSTER_REDIS_URL"),
        help="use this Redis instead of a private one",
    )
    starting.add_argument("--ready-timeout", type=float, default=180.0)
    starting.add_argument("--format", choices=["json", "env"], default="json")
    commands.add_parser("start", parents=[directory, starting], help="start and leave running")
    commands.add_parser("up", parents=[directory, starting], help="start, stop on Ctrl-C")
    commands.add_parser("stop", parents=[directory], help="stop what runs in --dir")
    commands.add_parser("status", parents=[directory], help="print what runs in --dir")
    return parser


def _print(info: ClusterInfo, form: str) -> None:
    sys.stdout.write(info.as_env() if form == "env" else info.as_json() + "\n")
    sys.stdout.flush()


@contextlib.contextmanager
def _interrupted_by_sigterm() -> Iterator[None]:
    """SIGTERM acts like Ctrl-C: the cluster is stopped on the way out."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    directory: Path = args.dir
    if args.command == "stop":
        stopped = Cluster.stop_dir(directory)
        sys.stderr.write(
            f"cluster: stopped {len(stopped)} processes in {directory}\n"
            if stopped
            else f"cluster: nothing runs in {directory}\n"
        )
        return 0
    if args.command == "status":
        state = read_state(directory)
        if state is None:
            sys.stderr.write(f"cluster: nothing runs in {directory}\n")
            return 1
        info, records = state
        _print(info, "json")
        for record in records:
            alive = "running" if _running(record) else "gone"
            sys.stderr.write(f"{record.name}: pid {record.pid} {alive}\n")
        return 0 if all(_running(r) for r in records) else 1
    cluster = Cluster(
        directory,
        gateways=args.gateways,
        nodes=args.nodes,
        runtimes=json.loads(args.runtimes),
        postgres_url=args.postgres_url,
        redis_url=args.redis_url,
        env=_caller_settings(),
        ready_timeout=args.ready_timeout,
    )
    with _interrupted_by_sigterm():
        try:
            info = cluster.start()
        except KeyboardInterrupt:
            sys.stderr.write("cluster: interrupted; stopped\n")
            return 130
        except ClusterError as exc:
            sys.stderr.write(f"cluster: {exc}\ncluster: stopped; logs in {directory}/logs\n")
            return 1
        _print(info, args.format)
        if args.command == "start":
            sys.stderr.write(f"cluster: running; `scripts/cluster stop --dir {directory}`\n")
            return 0
        sys.stderr.write("cluster: running; Ctrl-C stops it\n")
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
        finally:
            cluster.stop()
        sys.stderr.write("cluster: stopped\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
