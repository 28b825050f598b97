"""A minimal keep-alive HTTP/1.1 JSON client for load generation.

httpx's AsyncClient costs a few milliseconds of CPU per request, which on a 2-core box
is as much as the server under test spends: the benchmark would mostly measure its own
client. This one writes a request and reads ``Content-Length`` bytes back, no more.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import urlsplit


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str):
        self._reader = reader
        self._writer = writer
        self._host = host

    @classmethod
    async def open(cls, url: str) -> Connection:
        parts = urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
        return cls(reader, writer, parts.netloc)

    async def post_json(self, path: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
        payload = json.dumps(body).encode()
        head = [
            f"POST {path} HTTP/1.1",
            f"Host: {self._host}",
            "Content-Type: application/json",
            f"Content-Length: {len(payload)}",
            *(f"{k}: {v}" for k, v in headers.items()),
            "",
            "",
        ]
        self._writer.write("\r\n".join(head).encode() + payload)
        status_line = await self._reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self._reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        data = await self._reader.readexactly(length) if length else b""
        return status, json.loads(data) if data else None

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()


async def load(
    url: str,
    path: str,
    body: Any,
    headers: dict[str, str],
    *,
    requests: int,
    concurrency: int,
    timings: list[dict[str, Any]] | None = None,
    expected: str = "succeeded",
) -> tuple[list[float], dict[str, int], float]:
    """POST ``body`` to ``path`` ``requests`` times from ``concurrency`` connections.

    Returns the latencies (ms) of answers that are 200 with ``status`` ``expected``
    (``succeeded``; ``failed`` for code meant to fail, such as a runaway loop), a count
    of every outcome (``"200:succeeded"``, ``"429"``, ...), and the wall time in seconds.
    ``timings``, if given, gets the ``timings`` object of each such answer (the platform's
    own record of the call's phases).
    """
    latencies: list[float] = []
    outcomes: dict[str, int] = {}
    remaining = requests

    async def worker() -> None:
        nonlocal remaining
        conn = await Connection.open(url)
        try:
            while remaining > 0:
                remaining -= 1
                started = time.perf_counter()
                status, answer = await conn.post_json(path, body, headers)
                elapsed = (time.perf_counter() - started) * 1000
                state = (answer or {}).get("status", "") if status == 200 else ""
                outcome = f"{status}:{state}" if state else str(status)
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                if outcome == f"200:{expected}":
                    latencies.append(elapsed)
                    if timings is not None and isinstance(answer.get("timings"), dict):
                        timings.append(answer["timings"])
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, outcomes, time.perf_counter() - started
