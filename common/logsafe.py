"""Tenant-supplied text in log lines: bounded and escaped.

A log line may carry what a tenant chose (a path, a command, a tag, an error message
that quotes them); ``loggable`` keeps it to about ``LIMIT`` bytes of UTF-8 and escapes
every control character (newlines, escapes, NULs: ``\\n``, ``\\x1b``) and backslash, so
one tenant can neither fill the log nor forge lines in it. Ids the platform made (a
sandbox id) need none of this.
"""

from __future__ import annotations

#: bytes of the tenant's text a log line keeps (the escapes may add some)
LIMIT = 100


def loggable(value: object, limit: int = LIMIT) -> str:
    """``value`` as text fit for a log line: escaped, cut to about ``limit`` bytes with
    the number of characters left out."""
    text = value if isinstance(value, str) else str(value)
    kept: list[str] = []
    size = 0
    for i, char in enumerate(text):
        size += len(char.encode("utf-8", "surrogatepass"))
        if size > limit:
            return "".join(kept) + f"...(+{len(text) - i} chars)"
        kept.append(_escaped(char))
    return "".join(kept)


def _escaped(char: str) -> str:
    code = ord(char)
    if char == "\\":
        return "\\\\"
    if code < 0x20 or code == 0x7F or 0x80 <= code < 0xA0 or code in (0x2028, 0x2029):
        named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char)
        return named or (f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")
    if 0xD800 <= code < 0xE000:  # a lone surrogate
        return f"\\u{code:04x}"
    return char
