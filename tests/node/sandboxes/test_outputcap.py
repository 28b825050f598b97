"""A command's output against its cap: what passes, what is dropped, and what the exit
event says of it."""

from __future__ import annotations

import time

from node.sandboxes.outputcap import OutputCap


def test_output_passes_up_to_the_cap_per_stream_and_the_exit_says_which_was_cut() -> None:
    cap = OutputCap(5)
    assert cap.take("stdout", b"abc") == b"abc"
    assert cap.take("stdout", b"defg") == b"de"  # the cap splits a chunk
    assert cap.take("stdout", b"h") == b""
    assert cap.take("stderr", b"12345") == b"12345"  # each stream has its own cap
    ended = cap.exit(exit_code=0, signal=None, timed_out=False, started=time.monotonic() - 1)
    assert ended.stdout_truncated and not ended.stderr_truncated
    assert ended.exit_code == 0 and ended.duration_ms >= 1000


def test_drained_bytes_and_a_terminals_count_as_cut_output() -> None:
    drained = OutputCap(5)
    drained.drop("stderr", 10)
    assert drained.exit(exit_code=None, signal=9, timed_out=True, started=0).stderr_truncated
    terminal = OutputCap(2)
    terminal.take("pty", b"abc")
    ended = terminal.exit(exit_code=1, signal=None, timed_out=False, started=0, error="x")
    assert ended.stdout_truncated and ended.error == "x" and ended.signal is None
