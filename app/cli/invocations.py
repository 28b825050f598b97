"""``invocations``: the tenant's runs and function calls (ls, get), through the SDK."""

from __future__ import annotations

from typing import Any

import click

from app.cli.root import client, echo_json, key_option, url_option

STATUSES = ("queued", "running", "succeeded", "failed", "errored")


@click.group()
def invocations() -> None:
    """The tenant's runs and function calls, newest first (tenant)."""


def _duration_ms(invocation: dict[str, Any]) -> str:
    stage = invocation.get("run") or invocation.get("compile") or {}
    wall = stage.get("wall_ms") if isinstance(stage, dict) else None
    return f"{wall:.0f}" if isinstance(wall, int | float) else "-"


@invocations.command("ls")
@click.option("--status", type=click.Choice(STATUSES), default=None, help="Only this status.")
@click.option(
    "--kind", type=click.Choice(("run", "function")), default=None, help="Only this kind."
)
@click.option("--limit", type=click.IntRange(1, 500), default=20, show_default=True)
@click.option("--cursor", default=None, help="The next_cursor a previous page printed.")
@click.option("--json", "as_json", is_flag=True, help="Print the page as JSON.")
@url_option
@key_option
def invocations_ls(
    status: str | None,
    kind: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
    url: str,
    api_key: str | None,
) -> None:
    """A page of invocations, one a line; the next page's cursor last, if there is one."""
    with client(url, api_key) as sdk:
        page = sdk.invocations.list(limit=limit, status=status, kind=kind, cursor=cursor)
    if as_json:
        echo_json(page)
        return
    click.echo(f"{'ID':<32} {'STATUS':<10} {'KIND':<9} {'LANGUAGE':<10} {'WALL_MS':>8}  CREATED")
    for item in page["invocations"]:
        click.echo(
            f"{item['invocation_id']:<32} {item['status']:<10} {item.get('kind') or '':<9} "
            f"{item.get('language') or '':<10} {_duration_ms(item):>8}  "
            f"{(item.get('created_at') or '')[:19]}"
        )
    if page.get("next_cursor"):
        click.echo(f"next page: --cursor {page['next_cursor']}", err=True)


@invocations.command("get")
@click.argument("invocation_id")
@url_option
@key_option
def invocations_get(invocation_id: str, url: str, api_key: str | None) -> None:
    """One invocation and its whole result, as JSON."""
    with client(url, api_key) as sdk:
        echo_json(sdk.invocations.get(invocation_id))


COMMANDS: list[click.Command] = [invocations]
