"""The ``corral`` group, and what its client commands share: the server's URL and a key
as options, an SDK client whose errors end the command cleanly, and JSON output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from corral import Corral, CorralError

DEFAULT_URL = "http://127.0.0.1:8080"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Corral: sandboxes and function execution for training AI agents."""


url_option = click.option(
    "--url",
    envvar="CORRAL_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="Server URL [CORRAL_URL].",
)
admin_option = click.option(
    "--admin-key", envvar="CORRAL_ADMIN_KEY", required=True, help="Admin key [CORRAL_ADMIN_KEY]."
)
key_option = click.option(
    "--api-key", envvar="CORRAL_API_KEY", default=None, help="Tenant API key [CORRAL_API_KEY]."
)


@contextmanager
def client(url: str, key: str | None) -> Iterator[Corral]:
    """An SDK client whose errors end the command cleanly (``Error: 404 not_found: ...``;
    a server that did not answer: why)."""
    try:
        with Corral(url, key) as sdk:
            yield sdk
    except CorralError as exc:
        raise click.ClickException(str(exc) if exc.status else exc.message) from None


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def pairs(items: tuple[str, ...], hint: str, what: str = "KEY=VALUE") -> dict[str, str]:
    """Repeated ``KEY=VALUE`` options as a dict."""
    found = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not {what}", param_hint=hint)
        found[name] = value
    return found
