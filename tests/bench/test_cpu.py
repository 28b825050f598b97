"""``bench/cpu.py`` finds every process of a tree, charges each thread its own CPU and an
ended child's to the process that waited for it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from cpu import threads, tree  # noqa: E402

PARENT = """
import subprocess, sys, threading, time
child = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)"])
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
print(child.pid, flush=True)
time.sleep(60)
"""


@contextlib.contextmanager
def started(script: str) -> Iterator[tuple[subprocess.Popen[str], IO[str]]]:
    """``script`` run by this interpreter in a session of its own, with its stdout; the
    whole session killed at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    try:
        yield proc, proc.stdout
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # its children too
        proc.wait()
        proc.stdout.close()


def test_a_tree_and_its_threads_are_found_and_the_busy_thread_charged() -> None:
    with started(PARENT) as (parent, out):
        child = int(out.readline())
        found = tree(parent.pid)
        assert sorted(found) == sorted([parent.pid, child])
        before = threads(found)
        time.sleep(0.5)
        after = threads(found)
        spent = {key: after[key][1] - before[key][1] for key in before}
        busiest = max(spent, key=lambda key: spent[key])
        assert busiest[0] == parent.pid and busiest[1] != parent.pid  # not the main thread
        assert spent[busiest] > 0.05  # it spun for some of the half second
        assert spent[(child, child)] < spent[busiest]
        assert {name for name, _ in after.values()} == {Path(sys.executable).name[:15]}


def test_the_machines_context_switches_are_counted() -> None:
    from cpu import context_switches

    before = context_switches()
    for _ in range(20):
        time.sleep(0.001)  # each sleep switches away from this thread
    assert context_switches() >= before + 20


def test_trees_alternate_and_their_medians_are_taken() -> None:
    from stats import alternate, medians

    order: list[str] = []

    def run(tree: str) -> dict[str, float]:
        order.append(tree)
        return {"calls_per_s": float(len(order)), "other": 0.0}

    runs = alternate({"after": "a", "before": "b"}, 3, run)
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert [r["calls_per_s"] for r in runs["after"]] == [1.0, 4.0, 5.0]
    assert medians(runs["after"], ["calls_per_s"]) == {"calls_per_s": 4.0}
    assert medians(runs["before"]) == {"calls_per_s": 3.0, "other": 0.0}


def test_pin_puts_the_server_on_one_cpu_and_the_rest_elsewhere() -> None:
    from cpu import pin

    everywhere = os.sched_getaffinity(0)
    try:
        with started(PARENT) as (parent, out):
            child = int(out.readline())
            mine, rest = pin(parent.pid, [child])
            assert mine == {min(everywhere)} and rest == everywhere - mine
            for pid, want in ((parent.pid, mine), (child, rest)):
                tids = os.listdir(f"/proc/{pid}/task")
                assert len(tids) >= 1
                assert all(os.sched_getaffinity(int(tid)) == want for tid in tids), pid
            assert os.sched_getaffinity(0) == rest  # the load generator
    finally:
        os.sched_setaffinity(0, everywhere)


#: forks a child that spins for a while and exits, waits for it, then says so and sleeps
REAPER = """
import os, sys, time
pid = os.fork()
if pid == 0:
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    os._exit(0)
os.waitpid(pid, 0)
print("reaped", flush=True)
time.sleep(60)
"""


def test_an_ended_child_is_charged_to_the_process_that_waited_for_it() -> None:
    from cpu import process_stats

    with started(REAPER) as (parent, out):
        before = process_stats([parent.pid])
        assert out.readline().strip() == "reaped"
        after = process_stats([parent.pid, 999_999_999])  # a pid that does not exist
        assert list(after) == [parent.pid]
        name, parents_name, reaped = after[parent.pid]
        assert name == Path(sys.executable).name[:15]
        with open(f"/proc/{os.getpid()}/comm") as f:
            assert parents_name == f.read().strip()  # this test's process started it
        # the child's 0.3 s of CPU, which no live thread of the tree holds any more
        assert reaped - before[parent.pid][2] >= 0.25
        assert threads([parent.pid])[(parent.pid, parent.pid)][1] < 0.25
