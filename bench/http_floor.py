"""The HTTP floor: what an ASGI server costs per call here, with no Corral in it.

Serves ``POST /v1/run`` from two apps that only read the body and answer a fixed JSON
result: ``bare`` (a raw ASGI callable) and ``starlette`` (one Starlette route, as Corral's
routes are), under uvicorn with httptools and uvloop as ``corral serve`` runs it, and,
when installed, under granian (Rust, one worker). Drives each with the same keep-alive
client as ``bench/fncall.py`` at each concurrency and reports latency, calls per second
and the server's CPU per call (its processes, children included). The baseline in the
same run is Corral itself: ``corral serve`` with the fake backend, the gateway's own
cost, driven the same way. Prints one JSON document.

    .venv/bin/python bench/http_floor.py --requests 3000 --concurrency 1,32
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fncall import Server, dev_env, drive, process_cpu_s
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

HERE = Path(__file__).resolve().parent
ANSWER = {"status": "succeeded", "exit_code": 0, "stdout": "", "stderr": ""}
_BODY = json.dumps(ANSWER).encode()


async def bare(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(_BODY))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": _BODY})


async def _run(request: Request) -> JSONResponse:
    await request.json()
    return JSONResponse(ANSWER)


starlette = Starlette(routes=[Route("/v1/run", _run, methods=["POST"])])


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its living children (granian serves from a child)."""
    total = process_cpu_s(pid)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                total += tree_cpu_s(int(entry.name))
    return total


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def command(server: str, app: str, port: int) -> list[str]:
    common = ["--port", str(port), "--log-level", "warning", "--loop", "uvloop"]
    if server == "uvicorn":
        options = ["--no-access-log", "--http", "httptools"]
    else:
        options = ["--interface", "asgi", "--workers", "1", "--no-ws"]
    return [sys.executable, "-m", server, *common, *options, f"http_floor:{app}"]


async def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        writer.close()
        await writer.wait_closed()
        return
    raise RuntimeError(f"nothing listens on {port}")


async def levels(
    url: str, key: str, pid: int, body: dict[str, Any], requests: int, concurrency: list[int]
) -> list[dict[str, Any]]:
    await drive(url, key, body, requests=min(500, requests), concurrency=8)  # warm up
    out = []
    for level in concurrency:
        before = tree_cpu_s(pid)
        result = await drive(url, key, body, requests=requests, concurrency=level)
        result["server_cpu_ms_per_call"] = round((tree_cpu_s(pid) - before) * 1000 / requests, 3)
        out.append(result)
    return out


def floor(server: str, app: str, requests: int, concurrency: list[int]) -> Any:
    port = free_port()
    proc = subprocess.Popen(
        command(server, app, port),
        cwd=HERE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        asyncio.run(wait_port(port))
        url = f"http://127.0.0.1:{port}"
        return asyncio.run(levels(url, "unused", proc.pid, ANSWER, requests, concurrency))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="per concurrency level")
    parser.add_argument("--concurrency", default="1,32")
    args = parser.parse_args()
    concurrency = [int(c) for c in args.concurrency.split(",")]
    servers = ["uvicorn"] + (["granian"] if importlib.util.find_spec("granian") else [])
    report: dict[str, Any] = {"benchmark": "http_floor", "cpus": os.cpu_count(), "floor": {}}
    for server in servers:
        for app in ("bare", "starlette"):
            report["floor"][f"{server}/{app}"] = floor(server, app, args.requests, concurrency)
    corral = Server(8, "fake", env=dev_env("fake"))
    try:
        corral.wait_ready()
        body = {"language": "fake", "code": "{}"}
        key = corral.tenant_key()
        report["baseline_corral_fake"] = asyncio.run(
            levels(corral.url, key, corral.proc.pid, body, args.requests, concurrency)
        )
    finally:
        corral.stop()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
