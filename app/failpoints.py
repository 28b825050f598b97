"""Named points where a test can make a gateway fail for real (dev mode only).

``CORRAL_FAILPOINTS='{"invocations.after_commit": "kill"}'`` makes the process SIGKILL
itself the first time it passes that point, so that fault tests exercise a real crash
between two steps rather than a simulation of one. Actions:

* ``kill``         SIGKILL this process.
* ``raise``        raise ``InjectedFault`` every time.
* ``raise-once``   raise ``InjectedFault`` the first time only.
* ``after:N:ACT``  pass N times, then do ACT.

Points: ``invocations.after_commit`` (the row and its Job are committed, nothing is
dispatched), ``recorder.before_commit`` (a batch of node results is about to be stored).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping

log = logging.getLogger(__name__)


class InjectedFault(RuntimeError):
    """Raised at a failpoint configured to raise."""


class Failpoints:
    def __init__(self, config: Mapping[str, str]) -> None:
        self._actions = dict(config)
        self._passes: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self._actions)

    def hit(self, name: str) -> None:
        action = self._actions.get(name)
        if action is None:
            return
        passes = self._passes.get(name, 0)
        self._passes[name] = passes + 1
        if action.startswith("after:"):
            _, count, action = action.split(":", 2)
            if passes < int(count):
                return
            passes -= int(count)
        if action == "kill":
            log.critical("failpoint %s: killing this process", name)
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "raise" or (action == "raise-once" and passes == 0):
            log.warning("failpoint %s: raising", name)
            raise InjectedFault(f"failpoint {name}")
