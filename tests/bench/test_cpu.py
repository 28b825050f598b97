"""``bench/cpu.py`` finds every process of a tree and charges each thread its own CPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def test_a_tree_and_its_threads_are_found_and_the_busy_thread_charged() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
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
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the child too
        parent.wait()
        assert parent.stdout is not None
        parent.stdout.close()


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
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        mine, rest = pin(parent.pid, [child])
        assert mine == {min(everywhere)} and rest == everywhere - mine
        for pid, want in ((parent.pid, mine), (child, rest)):
            tids = os.listdir(f"/proc/{pid}/task")
            assert len(tids) >= 1
            assert all(os.sched_getaffinity(int(tid)) == want for tid in tids), pid
        assert os.sched_getaffinity(0) == rest  # the load generator
    finally:
        os.sched_setaffinity(0, everywhere)
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
        assert parent.stdout is not None
        parent.stdout.close()
