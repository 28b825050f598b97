"""sandbox_totals: what each tenant's live sandboxes hold together (count, memory, CPU,
disk), kept in the transactions that write sandbox rows; filled from the live rows

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-10 13:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

LIVE = ("creating", "running", "paused")


def upgrade() -> None:
    totals = op.create_table(
        "sandbox_totals",
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("live", sa.Integer(), nullable=False),
        sa.Column("memory_mb", sa.BigInteger(), nullable=False),
        sa.Column("cpu_milli", sa.BigInteger(), nullable=False),
        sa.Column("disk_mb", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_sandbox_totals_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_sandbox_totals")),
    )
    sandboxes = sa.table(
        "sandboxes",
        sa.column("tenant_id", sa.String),
        sa.column("state"),
        sa.column("spec", sa.JSON),
    )
    held: dict[str, dict[str, int]] = {}
    query = sa.select(sandboxes.c.tenant_id, sandboxes.c.spec).where(sandboxes.c.state.in_(LIVE))
    for tenant_id, spec in op.get_bind().execute(query):
        spec = spec or {}  # the create's defaults where the spec lacks a size
        sums = held.setdefault(
            tenant_id,
            {"tenant_id": tenant_id, "live": 0, "memory_mb": 0, "cpu_milli": 0, "disk_mb": 0},
        )
        sums["live"] += 1
        sums["memory_mb"] += int(spec.get("memory_mb", 512))
        sums["cpu_milli"] += round(float(spec.get("cpu", 1.0)) * 1000)
        sums["disk_mb"] += int(spec.get("disk_mb", 1024))
    if held:
        op.bulk_insert(totals, list(held.values()))


def downgrade() -> None:
    op.drop_table("sandbox_totals")
