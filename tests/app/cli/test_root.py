"""The ``corral`` group: every command is registered and answers --help."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.cli import main
from tests.app.cli.conftest import corral

#: Every command, as its argv; each must answer --help.
COMMANDS = [
    [],
    ["serve"],
    ["gateway"],
    ["node"],
    ["db"],
    ["db", "upgrade"],
    ["tenant"],
    ["tenant", "create"],
    ["tenant", "list"],
    ["key"],
    ["key", "create"],
    ["key", "revoke"],
    ["run"],
    ["usage"],
    ["functions"],
    ["functions", "deploy"],
    ["functions", "list"],
    ["functions", "invoke"],
    ["invocations"],
    ["invocations", "ls"],
    ["invocations", "get"],
    ["images"],
    ["images", "build"],
    ["images", "import"],
    ["images", "ls"],
    ["images", "rm"],
    ["sandbox"],
    ["sandbox", "create"],
    ["sandbox", "exec"],
    ["sandbox", "cp"],
    ["sandbox", "ls"],
    ["sandbox", "rm"],
    ["sandbox", "pause"],
    ["sandbox", "resume"],
]


# --- help ---------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: " ".join(argv) or "corral")
def test_help(argv: list[str]) -> None:
    result = corral(*argv, "--help")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Usage: ")
    assert "--help" in result.stdout


def test_top_level_help_lists_every_command() -> None:
    result = corral("-h")
    assert result.exit_code == 0
    for name in ("serve", "gateway", "node", "db", "tenant", "key", "run"):
        assert name in result.stdout


def test_help_covers_every_registered_command() -> None:
    import click

    def walk(group: click.Group, prefix: list[str]) -> Iterator[list[str]]:
        for name, command in group.commands.items():
            yield [*prefix, name]
            if isinstance(command, click.Group):
                yield from walk(command, [*prefix, name])

    assert sorted(walk(main, [])) == sorted(c for c in COMMANDS if c)
