"""The sandbox API on real containers (crun) with the default ``python`` image, as
``make run`` serves it: a real uvicorn server, the embedded node on its Unix socket."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import corral
from images import ImageStore
from node.sandboxes.crun.process import READ_CHUNK
from tests.app.api.v1.test_sandboxes import stopped_soon
from tests.conftest import ADMIN
from tests.node.sandboxes.conftest import leftovers
from tests.requirements import missing

pytestmark = [pytest.mark.crun, pytest.mark.slow]

PROJECT_IMAGES = Path(__file__).resolve().parents[4] / "var" / "images"


def python_images_dir() -> Path:
    if not (PROJECT_IMAGES / "names" / "python").exists():
        missing("the python image is not built (scripts/setup-images.sh)")
    return PROJECT_IMAGES


def test_a_python_sandbox_through_a_real_server(
    live_server: Callable[..., str], tmp_path: Path
) -> None:
    url = live_server(sandbox_backends=["crun"], images_dir=python_images_dir())
    made = httpx.post(f"{url}/v1/tenants", json={"name": "crun-api"}, headers=ADMIN).json()
    headers = {"Authorization": f"Bearer {made['key']['api_key']}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as api:
        deadline = time.monotonic() + 20
        while True:
            created = api.post("/v1/sandboxes", json={"image": "python", "memory_mb": 256})
            if created.status_code != 503 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert created.status_code == 201, created.text
        sbx: dict[str, Any] = created.json()
        one = f"/v1/sandboxes/{sbx['id']}"
        code = "import sys, platform\nprint(sys.version_info[:2], platform.node())\n"
        put = api.put(f"{one}/files", params={"path": "/home/user/main.py"}, content=code)
        assert put.status_code == 200 and put.json()["owner"] == "1000"
        ran = api.post(f"{one}/exec", json={"cmd": ["python3", "main.py"]}).json()
        assert ran["exit_code"] == 0 and ran["stdout"] == "(3, 11) sandbox\n", ran
        shell = api.post(
            f"{one}/exec",
            json={
                "command": "whoami; git --version | cut -d' ' -f1; "
                "gcc --version | head -1 | cut -c1-3"
            },
        ).json()
        assert shell["stdout"].split() == ["user", "git", "gcc"], shell
        offline = api.post(
            f"{one}/exec",
            json={
                "cmd": [
                    "python3",
                    "-c",
                    "import socket; socket.create_connection(('1.1.1.1', 80), 2)",
                ]
            },
        ).json()
        assert (
            offline["exit_code"] != 0 and "OSError" in offline["stderr"]
        ) or "unreachable" in offline["stderr"]
        record = api.get(one).json()
        assert record["state"] == "running" and record["memory_bytes"] > 0
        assert record["timings"]["start_ms"] > 0
        assert api.delete(one).json()["state"] == "stopping"  # acknowledged
        stopped_soon(api, {}, sbx["id"])  # torn down
    assert leftovers(tmp_path / "data", sbx["id"]) == []


def test_exec_output_through_a_real_server_is_exact(
    live_server: Callable[..., str], tmp_path: Path
) -> None:
    """A character cut by the node's 64 KiB reads, and bytes that are not text, through
    the whole answer, a stream and the SDK."""
    url = live_server(sandbox_backends=["crun"], images_dir=python_images_dir())
    made = httpx.post(f"{url}/v1/tenants", json={"name": "crun-bytes"}, headers=ADMIN).json()
    key = made["key"]["api_key"]
    with corral.Corral(url, key) as sdk:
        sbx = _created(lambda: sdk.sandboxes.create("python", memory_mb=256))
        try:
            _exact_output(url, key, sbx)
        finally:
            sbx.kill()


def _exact_output(url: str, key: str, sbx: corral.Sandbox) -> None:
    split = b"a" * (READ_CHUNK - 1) + "€".encode() * 100_000
    noise = os.urandom(300_000)
    for name, data in (("split", split), ("noise", noise)):
        sbx.files.write(f"/home/user/{name}", data)
    with httpx.Client(base_url=url, timeout=60) as api:
        api.headers["authorization"] = f"Bearer {key}"
        one = f"/v1/sandboxes/{sbx.id}/exec"
        text = api.post(one, json={"cmd": ["cat", "split"]}).json()
        assert text["stdout"] == split.decode() and text["stdout_b64"] is None
        binary = api.post(one, json={"cmd": ["cat", "noise"]}).json()
        assert base64.b64decode(binary["stdout_b64"]) == noise
        streamed = api.post(one, json={"cmd": ["cat", "split", "noise"], "stream": True})
        events = [json.loads(line) for line in streamed.iter_lines()]
        output = [e for e in events if e["kind"] == "output"]
        assert "".join(e["data"] for e in output).startswith(split.decode())
        joined = b"".join(
            base64.b64decode(e["data_b64"]) if e["data_b64"] else e["data"].encode() for e in output
        )
        assert joined == split + noise
    assert sbx.exec(["cat", "split"]).stdout == split.decode()
    assert sbx.exec(["cat", "noise"], on_stdout=lambda _: None).stdout_bytes == noise


def _created(make: Callable[[], corral.Sandbox]) -> corral.Sandbox:
    """A sandbox, once the embedded node's first report has come."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return make()
        except corral.NodeUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_network_allow_list_through_a_real_server(
    live_server: Callable[..., str], outside: str
) -> None:
    url = live_server(
        sandbox_backends=["crun"],
        images_dir=python_images_dir(),
        sandbox_network_cidr="10.216.0.0/24",
        sandbox_network_deny=["192.168.0.0/16"],
    )
    made = httpx.post(f"{url}/v1/tenants", json={"name": "crun-net"}, headers=ADMIN).json()
    headers = {"Authorization": f"Bearer {made['key']['api_key']}"}
    probe = (
        "import socket, sys\n"
        "for port in (8080, 8081):\n"
        "    try:\n"
        f"        c = socket.create_connection(('{outside}', port), 3)\n"
        "        print(c.recv(64).decode().split()[0])\n"
        "    except OSError as e:\n"
        "        print(port, type(e).__name__)\n"
    )
    with httpx.Client(base_url=url, headers=headers, timeout=60) as api:
        bad = api.post("/v1/sandboxes", json={"network": {"allow": ["pypi.org:0"]}})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "validation_error"
        for closed in ("169.254.169.254:80", "192.168.1.1"):
            refused = api.post("/v1/sandboxes", json={"network": {"allow": [closed]}})
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["code"] == "invalid_network"
        created = api.post(
            "/v1/sandboxes", json={"memory_mb": 256, "network": {"allow": [f"{outside}:8080"]}}
        )
        assert created.status_code == 201, created.text
        one = f"/v1/sandboxes/{created.json()['id']}"
        ran = api.post(f"{one}/exec", json={"cmd": ["python3", "-c", probe]}).json()
        assert ran["stdout"].split("\n")[:2] == ["hello-8080", "8081 ConnectionRefusedError"], ran
        assert api.get(one).json()["network"] == {"allow": [f"{outside}:8080"]}
        api.delete(one)


def test_hostile_programs_in_python_sandboxes_through_a_real_server(
    live_server: Callable[..., str], tmp_path: Path
) -> None:
    """The issue's hostile programs on the image ``make run`` serves, through the API: an
    endless ``yes``, root overwriting ``/bin/bash``, and probes of the Corral API's own
    port and the node's socket. Each is contained and the server keeps serving."""
    url = live_server(sandbox_backends=["crun"], images_dir=python_images_dir())
    port = int(url.rsplit(":", 1)[1])
    data_dir = (tmp_path / "data").resolve()
    node_socket = data_dir / "node.sock"
    assert node_socket.exists()
    made = httpx.post(f"{url}/v1/tenants", json={"name": "crun-vandal"}, headers=ADMIN).json()
    headers = {"Authorization": f"Bearer {made['key']['api_key']}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as api:
        ids = [api.post("/v1/sandboxes", json={"memory_mb": 256}) for _ in range(2)]
        assert all(r.status_code == 201 for r in ids), [r.text for r in ids]
        vandal, bystander = (f"/v1/sandboxes/{r.json()['id']}" for r in ids)

        # an endless flood: cut at the output cap, killed at its timeout
        flood = api.post(f"{vandal}/exec", json={"cmd": ["yes"], "timeout_s": 2}).json()
        assert flood["timed_out"] and flood["stdout_truncated"], {**flood, "stdout": "…"}
        assert 0 < len(flood["stdout"]) <= 8 << 20

        # root replaces bash: that sandbox's bash is gone, nobody else's
        wrecked = api.post(
            f"{vandal}/exec",
            json={"command": "echo 'exit 99' > /bin/bash; /bin/bash -c 'echo x'", "user": "root"},
        ).json()
        assert wrecked["exit_code"] != 0 and "x" not in wrecked["stdout"], wrecked
        image_bash = ImageStore(python_images_dir()).resolve("python").rootfs / "bin/bash"
        assert image_bash.read_bytes()[:4] == b"\x7fELF"  # the shared base is untouched
        fine = api.post(f"{bystander}/exec", json={"cmd": ["/bin/bash", "-c", "echo $((6*7))"]})
        assert fine.json()["stdout"] == "42\n", fine.text

        # the Corral API's port and the node's socket are out of reach
        probe = (
            "import os, socket\n"
            f"try: socket.create_connection(('127.0.0.1', {port}), 2); print('reached')\n"
            "except OSError as e: print(type(e).__name__)\n"
            f"print([p for p in ({str(node_socket)!r}, {str(data_dir)!r}) if os.path.exists(p)])\n"
        )
        probed = api.post(
            f"{vandal}/exec", json={"cmd": ["python3", "-c", probe], "user": "root"}
        ).json()
        assert probed["stdout"].splitlines() == ["ConnectionRefusedError", "[]"], probed
        assert api.get("/v1/sandboxes").status_code == 200  # the server kept serving
        for one in (vandal, bystander):
            gone = api.delete(one).json()
            assert gone["state"] == "stopping"
            stopped_soon(api, {}, gone["id"])
    for r in ids:
        assert leftovers(tmp_path / "data", r.json()["id"]) == []
