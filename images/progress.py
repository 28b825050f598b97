"""Progress of a long build: one line per stage, with the seconds since the start.

Lines go to the module logger and, if given, to ``report`` (the CLI prints them).
A tool's own chatty output is condensed by ``Progress.tool_line``: a line is passed on
when it is of a kind not seen before (its first word, digits dropped, after a tag such
as debootstrap's "I:": "Retrieving", "Extracting", apt's "Unpacking", "Setting") or when
``heartbeat_s`` seconds passed since the last line shown, so a build of a minute prints
a few dozen lines, not thousands.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

Report = Callable[[str], None]

_TAG = re.compile(r"^[A-Z]:\s+")
_DIGITS = re.compile(r"\d+")


class Progress:
    def __init__(
        self,
        report: Report | None = None,
        *,
        heartbeat_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._report = report
        self._clock = clock
        self._start = clock()
        self._heartbeat_s = heartbeat_s
        self._kinds: set[str] = set()
        self._last_line_at = self._start

    @property
    def elapsed(self) -> float:
        return self._clock() - self._start

    def stage(self, message: str) -> None:
        """A new stage: its line, and every kind of tool line is new again."""
        self._kinds.clear()
        self._emit(message)

    def _emit(self, message: str) -> None:
        line = f"[{self.elapsed:6.1f}s] {message}"
        log.info("%s", line)
        self._last_line_at = self._clock()
        if self._report is not None:
            self._report(line)

    def tool_line(self, line: str) -> None:
        """A line of a tool's output: shown if of a new kind, or on a heartbeat."""
        line = line.rstrip()
        if not line.strip():
            return
        words = _TAG.sub("", line).split()
        # Indented lines (apt's package lists) are never a kind of their own.
        kind = "" if line[0].isspace() else _DIGITS.sub("", words[0]) if words else ""
        now = self._clock()
        new = bool(kind) and kind not in self._kinds
        if new or now - self._last_line_at >= self._heartbeat_s:
            self._kinds.add(kind)
            self._emit("  " + line.strip()[:200])
