"""Operator and account commands: ``tenant`` and ``key`` (with the admin key) and
``usage`` (a tenant's own, or everyone's with the admin key), through the SDK."""

from __future__ import annotations

from typing import Any

import click

from app.cli.root import admin_option, client, echo_json, pairs, url_option


@click.group()
def tenant() -> None:
    """Manage tenants (admin)."""


@tenant.command("create")
@click.argument("name")
@click.option(
    "--quota",
    "quota",
    multiple=True,
    metavar="FIELD=VALUE",
    help="A quota, e.g. --quota max_concurrent_executions=64 (repeatable).",
)
@url_option
@admin_option
def tenant_create(name: str, quota: tuple[str, ...], url: str, admin_key: str) -> None:
    """Create tenant NAME and print it with its first API key (shown once)."""
    quotas = pairs(quota, "--quota", "FIELD=VALUE")
    with client(url, admin_key) as sdk:
        echo_json(sdk.tenants.create(name, quota=quotas))


@tenant.command("list")
@url_option
@admin_option
def tenant_list(url: str, admin_key: str) -> None:
    """List tenants."""
    with client(url, admin_key) as sdk:
        echo_json(sdk.tenants.list())


@click.command()
@click.option("--start", default=None, help="From (ISO 8601 with a timezone) [24 h before end].")
@click.option("--end", default=None, help="Until (ISO 8601 with a timezone) [now].")
@click.option(
    "--group-by",
    default="tenant,day",
    show_default=True,
    help="Comma-separated: tenant, backend, language, function, kind, hour, day.",
)
@click.option("--tenant", default=None, help="One tenant's id (with the admin key).")
@click.option(
    "--format",
    "output",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
)
@url_option
@click.option(
    "--api-key",
    envvar=["CORRAL_API_KEY", "CORRAL_ADMIN_KEY"],
    required=True,
    help="A tenant's key (its own usage) or the admin key (everyone's) "
    "[CORRAL_API_KEY, CORRAL_ADMIN_KEY].",
)
def usage(
    start: str | None,
    end: str | None,
    group_by: str,
    tenant: str | None,
    output: str,
    url: str,
    api_key: str,
) -> None:
    """Use and cost over a time range, grouped (GET /v1/usage)."""
    query = {"group_by": group_by, "start": start, "end": end, "tenant": tenant}
    with client(url, api_key) as sdk:
        if output == "csv":
            click.echo(sdk.usage_csv(**query), nl=False)
            return
        report = sdk.usage(**query)
    if output == "json":
        echo_json(report)
        return
    click.echo(usage_table(report))


def usage_table(report: dict[str, Any]) -> str:
    """A usage report as an aligned text table, its total last."""
    groups: list[str] = report["group_by"]
    columns = [
        *groups,
        "events",
        "failures",
        "cpu_s",
        "memory_gb_s",
        "instance_hours",
        "stored_gb_hours",
        "queue_share",
        "setup_share",
        "exec_share",
        "cost",
    ]
    shown = [
        *(r["group"] | {k: v for k, v in r.items() if k != "group"} for r in report["rows"]),
        {**report["total"], **dict.fromkeys(groups, ""), groups[0]: "total"},
    ]

    def cell(row: dict[str, Any], column: str) -> str:
        value = row[column]
        if column.endswith("_share"):
            return f"{value * 100:.1f}%"
        if column == "cost":
            return f"{value:.6f}"
        if isinstance(value, float):
            return f"{value:.3f}"
        return str(value)

    cells = [[cell(row, c) for c in columns] for row in shown]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    lines.append(f"{report['start']} .. {report['end']}, {report['currency']}")
    return "\n".join(lines)


@click.group()
def key() -> None:
    """Manage a tenant's API keys (admin)."""


@key.command("create")
@click.argument("tenant_id")
@click.option("--name", default="", help="A label for the key.")
@url_option
@admin_option
def key_create(tenant_id: str, name: str, url: str, admin_key: str) -> None:
    """Create an API key for TENANT_ID and print it (shown once)."""
    with client(url, admin_key) as sdk:
        echo_json(sdk.keys.create(tenant_id, name=name))


@key.command("revoke")
@click.argument("tenant_id")
@click.argument("key_id")
@url_option
@admin_option
def key_revoke(tenant_id: str, key_id: str, url: str, admin_key: str) -> None:
    """Revoke KEY_ID of TENANT_ID."""
    with client(url, admin_key) as sdk:
        echo_json(sdk.keys.revoke(tenant_id, key_id))


COMMANDS: list[click.Command] = [tenant, key, usage]
