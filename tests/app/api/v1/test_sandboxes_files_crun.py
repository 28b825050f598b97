"""The sandbox file API on real containers (crun) through a real server, gateway and
embedded node in one process as ``make run`` serves them: file calls act as the user they
name, bytes stream with the server's memory flat, listings come in pages, uploads are
charged to the sandbox, transfers are bounded per tenant, a paused sandbox refuses."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.app.api.v1.test_sandboxes_crun import python_images_dir
from tests.conftest import ADMIN
from tests.node.sandboxes.conftest import cgroup_file

pytestmark = [pytest.mark.crun, pytest.mark.slow]


def rss() -> int:
    """The resident memory of this process: the server's (it runs in a thread here)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Api:
    """One tenant's client of a real server, with one python sandbox."""

    def __init__(self, url: str, name: str, data_dir: Path) -> None:
        made = httpx.post(f"{url}/v1/tenants", json={"name": name}, headers=ADMIN).json()
        headers = {"Authorization": f"Bearer {made['key']['api_key']}"}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=120)
        self.data_dir = data_dir
        self.made: list[str] = []

    def close(self) -> None:
        for one in self.made:
            self.http.delete(one)
        self.http.close()

    def sandbox(self, **body: Any) -> str:
        deadline = time.monotonic() + 20
        while True:  # the embedded node announces itself within a heartbeat
            made = self.http.post("/v1/sandboxes", json={"image": "python", **body})
            if made.status_code != 503 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert made.status_code == 201, made.text
        self.made.append(f"/v1/sandboxes/{made.json()['id']}")
        return self.made[-1]

    def sh(self, one: str, command: str, user: str = "user") -> str:
        ran = self.http.post(f"{one}/exec", json={"command": command, "user": user}).json()
        assert ran["exit_code"] == 0, ran
        return str(ran["stdout"])

    def cgroup(self, one: str) -> str:
        """The runtime's name of the sandbox (a warm sandbox keeps its own)."""
        directory = self.data_dir / "sandboxes" / one.rsplit("/", 1)[1]
        return os.readlink(directory) if directory.is_symlink() else directory.name


@pytest.fixture
def serve(live_server: Callable[..., str], tmp_path: Path) -> Iterator[Callable[..., Api]]:
    urls: dict[str, str] = {}
    tenants: list[Api] = []

    def tenant(name: str, **settings: Any) -> Api:
        if "url" not in urls:
            urls["url"] = live_server(
                sandbox_backends=["crun"], images_dir=python_images_dir(), **settings
            )
        tenants.append(Api(urls["url"], name, tmp_path / "data"))
        return tenants[-1]

    try:
        yield tenant
    finally:
        for api in tenants:
            api.close()


def test_the_reviews_symlinks_get_permission_denied_through_the_api(
    serve: Callable[..., Api],
) -> None:
    api = serve("deputy")
    one = api.sandbox()
    api.sh(one, "echo hidden > /root/.secret; chmod 600 /root/.secret", "root")
    passwd = api.sh(one, "cat /etc/passwd")
    api.sh(one, "ln -s /etc/passwd ~/notes.txt; ln -s /root/.secret ~/answer.txt")
    put = api.http.put(
        f"{one}/files", params={"path": "/home/user/notes.txt"}, content=b"user:x:0:0::/:/bin/sh"
    )
    assert put.status_code == 403 and put.json()["error"]["code"] == "permission_denied", put.text
    got = api.http.get(f"{one}/files", params={"path": "/home/user/answer.txt"})
    assert got.status_code == 403 and got.json()["error"]["code"] == "permission_denied"
    assert "hidden" not in got.text
    assert api.sh(one, "cat /etc/passwd") == passwd
    assert api.sh(one, "stat -c '%U %a' /etc/passwd; id -u") == "root 644\n1000\n"
    as_root = api.http.get(f"{one}/files", params={"path": "/root/.secret", "user": "root"})
    assert as_root.content == b"hidden\n"


def test_a_large_sparse_file_streams_through_the_gateway_with_memory_flat(
    serve: Callable[..., Api],
) -> None:
    api = serve("sparse")
    one = api.sandbox(disk_mb=64)
    api.sh(one, "truncate -s 200M /tmp/sparse")
    start, peak, total = rss(), 0, 0
    with api.http.stream("GET", f"{one}/files", params={"path": "/tmp/sparse"}) as answer:
        assert answer.status_code == 200
        for chunk in answer.iter_raw():
            total += len(chunk)
            peak = max(peak, rss())
    assert total == 200 << 20
    assert peak - start < 32 << 20, (peak - start) >> 20  # a memory bound, not a timing


def test_transfers_past_the_tenants_bound_get_429_and_not_its_neighbours(
    serve: Callable[..., Api],
) -> None:
    api = serve("busy", sandbox_transfers_per_tenant=2)
    neighbour = serve("neighbour")
    one, theirs = api.sandbox(disk_mb=64), neighbour.sandbox()
    api.sh(one, "truncate -s 64M /tmp/big")
    with ExitStack() as held:
        for _ in range(2):  # two downloads still running: their answers are not read
            answer = held.enter_context(
                api.http.stream("GET", f"{one}/files", params={"path": "/tmp/big"})
            )
            assert answer.status_code == 200
        third = api.http.get(f"{one}/files", params={"path": "/tmp/big"})
        assert third.status_code == 429, third.text
        assert third.json()["error"]["code"] == "too_many_transfers"
        assert third.headers["retry-after"] == "1"
        put = api.http.put(f"{one}/files", params={"path": "/tmp/x"}, content=b"x")
        assert put.status_code == 429
        theirs_put = neighbour.http.put(f"{theirs}/files", params={"path": "/tmp/x"}, content=b"x")
        assert theirs_put.status_code == 200, theirs_put.text
    # the two ended (closed unread): their places are free again, once the server has
    # seen them go
    deadline = time.monotonic() + 10
    while (
        put := api.http.put(f"{one}/files", params={"path": "/tmp/x"}, content=b"x")
    ).status_code == 429:
        assert time.monotonic() < deadline, "the two transfers' places were never freed"
        time.sleep(0.05)
    assert put.status_code == 200, put.text


def test_a_large_directory_is_listed_in_pages(serve: Callable[..., Api]) -> None:
    api = serve("pages")
    one = api.sandbox(disk_mb=64)
    api.sh(one, "mkdir ~/d && cd ~/d && for i in $(seq 2500); do : > f$i; done")
    seen: list[str] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"path": "/home/user/d", "limit": 1000}
        if cursor:
            params["cursor"] = cursor
        page = api.http.get(f"{one}/files/list", params=params).json()
        assert len(page["entries"]) <= 1000
        seen += [e["name"] for e in page["entries"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(f"f{i}" for i in range(1, 2501)) and len(seen) == 2500
    first = api.http.get(f"{one}/files/list", params={"path": "/home/user/d"}).json()
    assert len(first["entries"]) == 1000 and first["next_cursor"]  # no limit: one full page


def test_uploads_are_charged_to_the_sandbox_through_the_api(serve: Callable[..., Api]) -> None:
    api = serve("uploads")
    one = api.sandbox(memory_mb=64, disk_mb=512)
    group = api.cgroup(one)

    def shmem() -> int:
        stats = cgroup_file("memory", group, "memory.stat").splitlines()
        return int(dict(line.split() for line in stats)["shmem"])

    before, blob = shmem(), b"u" * (7 << 20)
    for i in range(3):
        put = api.http.put(f"{one}/files", params={"path": f"/home/user/u{i}"}, content=blob)
        assert put.status_code == 200, put.text
    assert shmem() - before >= 3 * len(blob)
    codes = [
        api.http.put(f"{one}/files", params={"path": f"/home/user/v{i}"}, content=blob).status_code
        for i in range(10)  # 70 MiB more into a sandbox of 64
    ]
    assert 507 in codes, codes
    limit = int(cgroup_file("memory", group, "memory.limit_in_bytes"))
    assert int(cgroup_file("memory", group, "memory.max_usage_in_bytes")) <= limit


def test_file_calls_on_a_paused_sandbox_answer_409(serve: Callable[..., Api]) -> None:
    api = serve("paused")
    one = api.sandbox()
    api.http.put(f"{one}/files", params={"path": "/tmp/a"}, content=b"a")
    assert api.http.post(f"{one}/pause").status_code == 200
    calls = [
        api.http.get(f"{one}/files", params={"path": "/tmp/a"}),
        api.http.put(f"{one}/files", params={"path": "/tmp/b"}, content=b"b"),
        api.http.get(f"{one}/files/list", params={"path": "/tmp"}),
        api.http.get(f"{one}/files/stat", params={"path": "/tmp/a"}),
        api.http.post(f"{one}/files/mkdir", json={"path": "/tmp/c"}),
        api.http.post(f"{one}/files/remove", json={"path": "/tmp/a"}),
        api.http.post(f"{one}/files/move", json={"source": "/tmp/a", "destination": "/tmp/d"}),
    ]
    for answer in calls:
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"]["code"] == "sandbox_not_running"
    assert api.http.post(f"{one}/resume").status_code == 200
    assert api.http.get(f"{one}/files", params={"path": "/tmp/a"}).content == b"a"


#: a large file's size (issue 31: 1 GiB round trips in the suite)
LARGE = 1 << 30
#: the most the server's resident memory may grow while it travels
FLAT = 64 << 20


def test_a_large_file_round_trips_through_the_sdk_with_memory_flat(
    serve: Callable[..., Api],
) -> None:
    from corral import Corral
    from tests.app.sandboxes.large import PeakMemory, Sink, Source

    api = serve("large")
    size_mb = (LARGE >> 20) + 512  # its files count against its memory
    key = api.http.headers["Authorization"].removeprefix("Bearer ")
    with Corral(str(api.http.base_url), key, timeout=120) as sdk:
        sbx = sdk.sandboxes.create("python", memory_mb=size_mb, disk_mb=size_mb)
        try:
            source = Source(LARGE)
            with PeakMemory() as up:
                entry = sbx.files.write("/home/user/big.bin", source)
            assert entry.size == LARGE
            sink = Sink()
            with PeakMemory() as down:
                assert sbx.files.read_into("/home/user/big.bin", sink) == LARGE  # type: ignore[arg-type]
            assert sink.digest() == source.digest()
            assert up.growth < FLAT, up.growth >> 20  # a memory bound, not a timing
            assert down.growth < FLAT, down.growth >> 20
        finally:
            sbx.kill()


def test_an_upload_cut_or_silent_frees_its_transfer_slot(serve: Callable[..., Api]) -> None:
    import socket
    from urllib.parse import urlsplit

    api = serve("cut", sandbox_transfers_per_tenant=1, transfer_idle_seconds=0.5)
    one = api.sandbox(disk_mb=64)
    where = urlsplit(str(api.http.base_url))
    head = (
        f"PUT {one}/files?path=/tmp/cut HTTP/1.1\r\nHost: {where.netloc}\r\n"
        f"Authorization: {api.http.headers['Authorization']}\r\n"
        "Content-Length: 1000000\r\n\r\n"
    ).encode()
    with socket.create_connection((where.hostname, where.port), timeout=10) as silent:
        silent.sendall(head + b"x" * 1000)  # then nothing
        answer = silent.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 408"), answer
    assert "upload_stalled" in answer
    with socket.create_connection((where.hostname, where.port), timeout=10) as cut:
        cut.sendall(head + b"y" * 1000)  # then gone
    deadline = time.monotonic() + 10
    while (
        put := api.http.put(f"{one}/files", params={"path": "/tmp/x"}, content=b"x")
    ).status_code == 429:
        assert time.monotonic() < deadline, "the cut upload's place was never freed"
        time.sleep(0.05)
    assert put.status_code == 200, put.text


def test_a_download_its_client_does_not_read_is_cut_and_frees_its_slot(
    serve: Callable[..., Api],
) -> None:
    api = serve("unread", sandbox_transfers_per_tenant=1, transfer_idle_seconds=0.5)
    one = api.sandbox(disk_mb=128)
    api.sh(one, "head -c 64M /dev/urandom > /tmp/big")  # more than the sockets' buffers
    with api.http.stream("GET", f"{one}/files", params={"path": "/tmp/big"}) as unread:
        assert unread.status_code == 200
        deadline = time.monotonic() + 10
        while (
            put := api.http.put(f"{one}/files", params={"path": "/tmp/x"}, content=b"x")
        ).status_code == 429:
            assert time.monotonic() < deadline, "the unread download's place was never freed"
            time.sleep(0.05)
        assert put.status_code == 200, put.text
        with pytest.raises(httpx.HTTPError):  # cut: never the whole file
            for _ in unread.iter_raw():
                pass
