"""Text a tenant chose (a path, a command, an error message that quotes them), made safe
to put in a log line: bounded and escaped.

A log line is the platform's own words: a tenant-sized string (a 4 KiB path in every
``CreateWatcher``) fills the logs, and one with newlines or terminal escapes forges lines
or rewrites an operator's terminal. ``shown(text)`` keeps at most ``limit`` characters,
escapes every control and non-printable character as ``repr`` would (``\\n``, ``\\x1b``),
and says how much it cut. Both planes use it (it is here, in ``wire``, so the data plane
needs nothing of the control plane's).
"""

from __future__ import annotations

#: characters of tenant text kept in a log line
LIMIT = 100


def shown(text: object, limit: int = LIMIT) -> str:
    """``text`` (its ``str``) bounded to ``limit`` characters and escaped, quoted:
    ``'/home/user/x'``, ``'/a\\nb'``, ``'aaaa…'(+3996 chars)``."""
    value = text if isinstance(text, str) else str(text)
    cut = len(value) - limit
    quoted = repr(value[:limit]) if cut > 0 else repr(value)
    return f"{quoted[:-1]}…{quoted[-1]}(+{cut} chars)" if cut > 0 else quoted
