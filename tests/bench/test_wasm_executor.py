"""``bench/wasm_executor.py`` measures each tree's own executor, in a child importing it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from wasm_executor import build_fib, run_tree  # noqa: E402


def _args(calls: int) -> argparse.Namespace:
    return argparse.Namespace(calls=calls, concurrency=4, warmup=5)


def test_a_tree_is_measured_on_its_own_executor(tmp_path: Path) -> None:
    module = build_fib(tmp_path)
    result = run_tree(ROOT, module, _args(40))  # the child checks each call's output
    assert set(result) == {
        "calls_per_s",
        "main_thread_cpu_ms_per_call",
        "process_cpu_ms_per_call",
    }
    assert result["calls_per_s"] > 0
    assert 0 < result["main_thread_cpu_ms_per_call"] <= result["process_cpu_ms_per_call"]


def test_a_tree_without_its_own_runtimes_is_refused(tmp_path: Path) -> None:
    """A tree whose ``runtimes`` package would come from elsewhere is not measured as it."""
    import subprocess

    tree = tmp_path / "tree"
    tree.mkdir()
    with pytest.raises(subprocess.CalledProcessError) as failed:
        run_tree(tree, build_fib(tmp_path), _args(5))
    assert "not from" in failed.value.stderr
