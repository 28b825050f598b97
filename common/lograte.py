"""Repeated log lines, rate-limited: a flood of one line must not fill the disk.

``RepeatLimit`` is a ``logging.Filter`` for the handlers of a process (the gateway's and
the node's logging set-up install it with ``install``). Lines are grouped by their
logger and message *template* (``record.msg`` before ``%`` formatting: every
"sandbox=%s: watching %s" is one group whatever its arguments). Per group, the first
``burst`` lines of each ``interval_s`` pass; the rest are counted, and when the group's
interval has ended, one summary line says how many were suppressed ("... 1712 similar
lines suppressed in 10 s"), logged by the same logger at the same level, before the
group's next line or within an interval of the next line of any group. At most
``max_groups`` groups are tracked (the oldest are summarised and forgotten).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from common.logsafe import loggable

#: lines of one group passed per interval, and the interval
BURST = 100
INTERVAL_S = 10.0
MAX_GROUPS = 4096

_Group = tuple[str, int, str]  # logger, level, template


@dataclass
class _Window:
    started: float
    passed: int = 0
    suppressed: int = 0


class RepeatLimit(logging.Filter):
    def __init__(
        self,
        *,
        burst: int = BURST,
        interval_s: float = INTERVAL_S,
        max_groups: int = MAX_GROUPS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.burst = burst
        self.interval_s = interval_s
        self._max_groups = max_groups
        self._clock = clock
        self._windows: collections.OrderedDict[_Group, _Window] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._swept = clock()
        self._summarising = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(self._summarising, "on", False):
            return True  # our own summary, logged from inside ``filter``
        group: _Group = (record.name, record.levelno, str(record.msg))
        due: list[tuple[_Group, int, float]] = []
        with self._lock:
            now = self._clock()
            window = self._windows.get(group)
            if window is not None and now - window.started >= self.interval_s:
                if window.suppressed:
                    due.append((group, window.suppressed, now - window.started))
                window = None
            if window is None:
                window = self._windows[group] = _Window(started=now)
                self._windows.move_to_end(group)
            window.passed += 1
            allowed = window.passed <= self.burst
            if not allowed:
                window.suppressed += 1
            if now - self._swept >= self.interval_s or len(self._windows) > self._max_groups:
                due += self._sweep(now)
        for summary in due:
            self._summarise(*summary)
        return allowed

    def _sweep(self, now: float) -> list[tuple[_Group, int, float]]:
        """Groups whose interval ended (and the oldest beyond ``max_groups``), forgotten;
        those that suppressed lines, to be summarised."""
        self._swept = now
        due = []
        for group, window in list(self._windows.items()):
            over = len(self._windows) > self._max_groups
            if over or now - window.started >= self.interval_s:
                del self._windows[group]
                if window.suppressed:
                    due.append((group, window.suppressed, now - window.started))
        return due

    def _summarise(self, group: _Group, suppressed: int, seconds: float) -> None:
        name, level, template = group
        self._summarising.on = True
        try:
            logging.getLogger(name).log(
                level,
                "%d similar lines suppressed in %.0f s (%s)",
                suppressed,
                seconds,
                loggable(template),
            )
        finally:
            self._summarising.on = False


def install(limit: RepeatLimit | None = None) -> RepeatLimit:
    """Rate-limit repeated lines on every handler of the root logger (call it after the
    handlers are set up, e.g. after ``logging.basicConfig``)."""
    limit = limit or RepeatLimit()
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RepeatLimit) for f in handler.filters):
            handler.addFilter(limit)
    return limit
