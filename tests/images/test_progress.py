"""Progress lines: a stage each, tool output condensed, elapsed seconds shown."""

from __future__ import annotations

from images import Progress


def test_tool_output_is_condensed_to_new_kinds_and_heartbeats() -> None:
    now = [100.0]
    lines: list[str] = []
    progress = Progress(lines.append, heartbeat_s=10.0, clock=lambda: now[0])
    progress.stage("debootstrap")
    for name in ("adduser", "apt", "bash"):
        progress.tool_line(f"I: Retrieving {name} 1.0")
        progress.tool_line(f"I: Validating {name} 1.0")
    progress.tool_line("    binutils gcc")  # indented: never a kind of its own
    now[0] += 11
    progress.tool_line("I: Validating zlib1g")  # heartbeat
    progress.tool_line("Get:12 http://x bookworm InRelease")
    progress.tool_line("Get:13 http://x bookworm Packages")
    progress.stage("apt-get install")
    progress.tool_line("I: Retrieving again")  # a new stage: new again
    assert lines == [
        "[   0.0s] debootstrap",
        "[   0.0s]   I: Retrieving adduser 1.0",
        "[   0.0s]   I: Validating adduser 1.0",
        "[  11.0s]   I: Validating zlib1g",
        "[  11.0s]   Get:12 http://x bookworm InRelease",
        "[  11.0s] apt-get install",
        "[  11.0s]   I: Retrieving again",
    ]
