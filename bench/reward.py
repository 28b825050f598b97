"""Reward workload benchmark: many short stdin/stdout programs, judged, as an RL trainer
scores a batch of sampled solutions.

``--programs`` Python programs (sums, sorts, string puzzles, number theory; a fixed,
seeded mix), each with its stdin and expected stdout, are sent to ``POST /v1/run`` at
``--concurrency`` from keep-alive connections; a result counts as correct when the run
succeeded and its stdout is the expected one. Starts ``corral serve`` (embedded, nsjail)
unless ``--url`` names a running server. Baselines in the same run, same programs, same
concurrency: a plain ``python3 -c`` subprocess per program (SandboxFusion's isolation-free
mode) and a fresh one-shot nsjail jail per program (``bench/fncall.py``'s flags). Prints
one JSON document with programs per second, latency and the ratio to each baseline.
``corral`` is a batch measured after a first batch at the same concurrency (the pool
filled, as in a training run's steady state); ``corral_first_batch`` is that first one.

    .venv/bin/python bench/reward.py --programs 500 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from typing import Any

from fncall import Server, one_shot_command
from httpload import Connection
from stats import latency_summary

Program = tuple[str, str, str]  # code, stdin, expected stdout


def programs(n: int, seed: int = 7) -> list[Program]:
    """A fixed mix of short judged programs."""
    rng = random.Random(seed)
    out: list[Program] = []
    kinds = [_sum, _sort, _reverse_words, _vowels, _gcd, _fib, _palindrome, _primes]
    for i in range(n):
        out.append(kinds[i % len(kinds)](rng))
    return out


def _sum(rng: random.Random) -> Program:
    nums = [rng.randint(-1000, 1000) for _ in range(rng.randint(1, 50))]
    code = "import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))\n"
    return code, " ".join(map(str, nums)) + "\n", f"{sum(nums)}\n"


def _sort(rng: random.Random) -> Program:
    nums = [rng.randint(0, 10_000) for _ in range(rng.randint(1, 100))]
    code = "xs = sorted(map(int, input().split()))\nprint(*xs)\n"
    return code, " ".join(map(str, nums)) + "\n", " ".join(map(str, sorted(nums))) + "\n"


def _reverse_words(rng: random.Random) -> Program:
    words = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 8))) for _ in range(9)]
    code = "print(' '.join(reversed(input().split())))\n"
    return code, " ".join(words) + "\n", " ".join(reversed(words)) + "\n"


def _vowels(rng: random.Random) -> Program:
    text = "".join(rng.choice("abcdeiouxyz ") for _ in range(rng.randint(5, 200)))
    code = "s = input()\nprint(sum(c in 'aeiou' for c in s))\n"
    return code, text + "\n", f"{sum(c in 'aeiou' for c in text)}\n"


def _gcd(rng: random.Random) -> Program:
    import math

    a, b = rng.randint(1, 10**9), rng.randint(1, 10**9)
    code = "a, b = map(int, input().split())\nwhile b:\n    a, b = b, a % b\nprint(a)\n"
    return code, f"{a} {b}\n", f"{math.gcd(a, b)}\n"


def _fib(rng: random.Random) -> Program:
    n = rng.randint(1, 90)
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    code = "n = int(input())\na, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\nprint(a)\n"
    return code, f"{n}\n", f"{a}\n"


def _palindrome(rng: random.Random) -> Program:
    half = "".join(rng.choice("abc") for _ in range(rng.randint(1, 6)))
    word = half + half[::-1] if rng.random() < 0.5 else half + "x" + half
    answer = "YES" if word == word[::-1] else "NO"
    code = "s = input().strip()\nprint('YES' if s == s[::-1] else 'NO')\n"
    return code, word + "\n", answer + "\n"


def _primes(rng: random.Random) -> Program:
    n = rng.randint(2, 5000)
    sieve = [True] * (n + 1)
    sieve[0:2] = [False, False]
    for i in range(2, int(n**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = [False] * len(sieve[i * i :: i])
    code = (
        "n = int(input())\ns = [True] * (n + 1)\ns[0:2] = [False, False]\n"
        "for i in range(2, int(n ** 0.5) + 1):\n    if s[i]:\n"
        "        s[i*i::i] = [False] * len(s[i*i::i])\nprint(sum(s))\n"
    )
    return code, f"{n}\n", f"{sum(sieve)}\n"


# --- the runs -------------------------------------------------------------------------------------
async def through_corral(
    url: str, key: str, work: list[Program], concurrency: int
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    queue = list(enumerate(work))
    latencies: list[float] = []
    correct = wrong = errors = 0

    async def worker() -> None:
        nonlocal correct, wrong, errors
        connection = await Connection.open(url)
        try:
            while queue:
                _, (code, stdin, expected) = queue.pop()
                body = {"language": "python", "code": code, "stdin": stdin}
                t0 = time.perf_counter()
                status, answer = await connection.post_json("/v1/run", body, headers)
                latencies.append((time.perf_counter() - t0) * 1000)
                if status != 200 or answer.get("status") != "succeeded":
                    errors += 1
                elif (answer.get("run") or {}).get("stdout") == expected:
                    correct += 1
                else:
                    wrong += 1
        finally:
            await connection.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return _result(latencies, time.perf_counter() - started, correct, wrong, errors)


async def through_subprocess(
    command: list[str], work: list[Program], concurrency: int
) -> dict[str, Any]:
    """Each program in a process of its own: ``command`` followed by ``-c CODE``."""
    semaphore = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    counts = {"correct": 0, "wrong": 0, "errors": 0}

    async def one(program: Program) -> None:
        code, stdin, expected = program
        async with semaphore:
            t0 = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                *command,
                "-c",
                code,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
            out, _ = await proc.communicate(stdin.encode())
            latencies.append((time.perf_counter() - t0) * 1000)
        if proc.returncode != 0:
            counts["errors"] += 1
        else:
            counts["correct" if out.decode() == expected else "wrong"] += 1

    started = time.perf_counter()
    await asyncio.gather(*(one(p) for p in work))
    return _result(latencies, time.perf_counter() - started, **counts)


def _result(
    latencies: list[float], wall_s: float, correct: int, wrong: int, errors: int
) -> dict[str, Any]:
    out = latency_summary(latencies, wall_s=wall_s, errors=errors)
    out.update(
        programs=len(latencies),
        correct=correct,
        wrong=wrong,
        programs_per_s=round(len(latencies) / wall_s, 1),
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url")
    parser.add_argument("--key")
    parser.add_argument("--programs", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--slots", type=int, default=32)
    args = parser.parse_args()
    work = programs(args.programs)
    result: dict[str, Any] = {
        "benchmark": "reward",
        "programs": args.programs,
        "concurrency": args.concurrency,
        "cpus": os.cpu_count(),
    }
    server = None
    try:
        if args.url:
            url, key = args.url, args.key
        else:
            server = Server(args.slots, "nsjail")
            server.wait_ready()
            url, key = server.url, server.tenant_key()
        # The first batch at the measured concurrency fills the tenant's pool (a jail
        # serves one call at a time: up to one per call in flight, each started once);
        # a trainer scores batch after batch, so the figure is the next batch's, with
        # the first one reported beside it. (Until 2026-12-02 the warm-up ran at
        # concurrency 8, so the measured batch also paid for starting some 24 jails.)
        first = work[: 4 * args.concurrency]
        result["corral_first_batch"] = asyncio.run(
            through_corral(url, key, first, args.concurrency)
        )
        result["corral"] = asyncio.run(through_corral(url, key, work, args.concurrency))
    finally:
        if server is not None:
            server.stop()
    python = ["/usr/bin/python3"]
    result["baseline_plain_subprocess"] = asyncio.run(
        through_subprocess(python, work, args.concurrency)
    )
    jail = one_shot_command()[:-2]  # the jail's flags and python3, without "-c print(1)"
    result["baseline_one_shot_jail"] = asyncio.run(through_subprocess(jail, work, args.concurrency))
    for name in ("baseline_plain_subprocess", "baseline_one_shot_jail"):
        result[f"ratio_to_{name.removeprefix('baseline_')}"] = round(
            result["corral"]["programs_per_s"] / result[name]["programs_per_s"], 2
        )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
