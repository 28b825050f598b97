"""Tenant text in a log line: bounded and escaped (issue 29, review finding #12)."""

from __future__ import annotations

from wire.logtext import LIMIT, shown


def test_short_text_is_quoted_as_is() -> None:
    assert shown("/home/user/notes") == "'/home/user/notes'"


def test_control_characters_cannot_forge_a_line_or_drive_a_terminal() -> None:
    text = shown("/tmp/a\n2026-01-01 INFO forged: admin login\x1b[2J\r")
    assert "\n" not in text and "\r" not in text and "\x1b" not in text
    assert "\\n" in text and "\\x1b" in text


def test_a_tenant_sized_string_is_cut_and_says_so() -> None:
    path = "/home/user/" + "a" * 4096
    text = shown(path)
    assert len(text) < LIMIT + 30
    assert text.endswith(f"(+{len(path) - LIMIT} chars)") and "…" in text


def test_anything_is_shown_through_its_str() -> None:
    assert shown(OSError(24, "inotify_init1")) == "'[Errno 24] inotify_init1'"
