"""``OutputCap``: a command's output against its cap, stream by stream.

Every backend's ``Process`` passes a command's output on up to ``max_output_bytes`` per
stream and drops the rest (the command runs on: its pipe is drained, not closed), and its
exit event says which streams were cut. This is that bookkeeping, once for all of them.
"""

from __future__ import annotations

import time
from typing import Literal

from wire.sandboxes import ExecExit

#: a command's output stream (``pty``: a terminal's, both in one)
Stream = Literal["stdout", "stderr", "pty"]


class OutputCap:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._kept: dict[Stream, int] = {"stdout": 0, "stderr": 0, "pty": 0}
        self._dropped: dict[Stream, int] = {"stdout": 0, "stderr": 0, "pty": 0}

    def take(self, stream: Stream, chunk: bytes) -> bytes:
        """The part of ``chunk`` within the cap (empty past it); the rest counts dropped."""
        kept = chunk[: max(self.cap - self._kept[stream], 0)]
        self._kept[stream] += len(kept)
        self._dropped[stream] += len(chunk) - len(kept)
        return kept

    def drop(self, stream: Stream, count: int) -> None:
        """``count`` bytes of ``stream`` were dropped without being read (drained)."""
        self._dropped[stream] += count

    def exit(
        self,
        *,
        exit_code: int | None,
        signal: int | None,
        timed_out: bool,
        started: float,
        error: str | None = None,
    ) -> ExecExit:
        """The command's exit event (``started``: its ``time.monotonic()`` start)."""
        return ExecExit(
            exit_code=exit_code,
            signal=signal,
            timed_out=timed_out,
            duration_ms=(time.monotonic() - started) * 1000,
            stdout_truncated=self._dropped["stdout"] + self._dropped["pty"] > 0,
            stderr_truncated=self._dropped["stderr"] > 0,
            error=error,
        )
