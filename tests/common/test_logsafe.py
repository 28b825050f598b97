"""Tenant-supplied text in log lines: escaped, bounded."""

from __future__ import annotations

from common.logsafe import LIMIT, loggable


def test_control_characters_cannot_forge_or_break_a_line() -> None:
    forged = "x\n2026-01-01 INFO app: admin logged in\r\x1b[31m\x00\\n\u2028\ud800"
    shown = loggable(forged, limit=1000)
    assert "\n" not in shown and "\r" not in shown and "\x1b" not in shown
    assert "\x00" not in shown and "\u2028" not in shown and "\ud800" not in shown
    assert shown == ("x\\n2026-01-01 INFO app: admin logged in\\r\\x1b[31m\\x00\\\\n\\u2028\\ud800")
    assert loggable("plain /home/user/é.txt") == "plain /home/user/é.txt"


def test_long_text_is_cut_to_about_the_limit_and_says_so() -> None:
    shown = loggable("a" * 5000)
    assert shown == "a" * LIMIT + "...(+4900 chars)"
    wide = loggable("é" * 200)  # two bytes each
    assert wide.startswith("é" * 50 + "...(+150")
    assert loggable(ValueError("x" * 10), limit=4) == "xxxx...(+6 chars)"
