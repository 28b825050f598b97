"""The one regex engine for tenants' patterns: RE2, whose matching time is linear in the
input for every pattern it accepts (it never backtracks).

RE2 refuses what cannot be matched that way (backreferences, lookahead, lookbehind) and
programs bigger than ``MAX_PROGRAM_BYTES``; ``compile_pattern`` turns that refusal into
``PatternRefused``. Python's ``re`` is never used on a tenant's pattern.
"""

from __future__ import annotations

import functools
from typing import Any

import re2

#: The memory one compiled pattern may use (its program and DFA caches); a pattern that
#: needs more is refused, so the compiled cache stays bounded.
MAX_PROGRAM_BYTES = 1 << 20
#: How many compiled patterns are kept (they are shared by every validator).
CACHE_SIZE = 4096


class PatternRefused(ValueError):
    """RE2 cannot compile the pattern: the message says why."""


def _options() -> Any:
    options = re2.Options()
    options.max_mem = MAX_PROGRAM_BYTES
    options.log_errors = False
    return options


_OPTIONS = _options()


@functools.lru_cache(maxsize=CACHE_SIZE)
def compile_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (cached); ``PatternRefused`` if RE2 cannot run it."""
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise PatternRefused(f"{pattern!r} cannot be used: {reason}") from None
    except UnicodeEncodeError:
        raise PatternRefused(f"{pattern!r} cannot be encoded as UTF-8") from None


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches anywhere in ``text`` (JSON Schema's ``pattern``
    semantics: not anchored). A ``text`` that cannot be encoded never matches."""
    try:
        return compile_pattern(pattern).search(text) is not None
    except UnicodeEncodeError:
        return False
