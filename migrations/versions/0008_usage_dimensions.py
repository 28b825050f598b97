"""usage by backend, language and function: the hourly rollups keyed by runtime, language
and function version as well (existing rows keep their sums under ``""``); bytes in and
out and retries on usage events and rollups; bytes in and out on invocations

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

SUMS = (
    "queue_ms",
    "setup_ms",
    "exec_ms",
    "teardown_ms",
    "cpu_ms",
    "instance_seconds",
    "memory_mb_seconds",
)
DIMENSIONS = ("runtime", "language", "function_version_id")


def _rollups(name: str, *, dimensions: bool) -> sa.Table:
    key = ("tenant_id", "hour", "kind", *(DIMENSIONS if dimensions else ()))
    return op.create_table(  # type: ignore[no-any-return]
        name,
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        *(
            sa.Column(d, sa.String(length=32), nullable=False)
            for d in (DIMENSIONS if dimensions else ())
        ),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("failures", sa.BigInteger(), nullable=False),
        *(sa.Column(n, sa.Float(), nullable=False) for n in SUMS),
        *(
            sa.Column(n, sa.BigInteger(), nullable=False)
            for n in (("bytes_in", "bytes_out", "retries") if dimensions else ())
        ),
        sa.PrimaryKeyConstraint(*key, name=op.f(f"pk_{name}")),
    )


def _replace_rollups(filled: str) -> None:
    """``filled`` becomes ``usage_rollups``, its primary key named as the models name it."""
    op.drop_table("usage_rollups")
    op.rename_table(filled, "usage_rollups")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE usage_rollups RENAME CONSTRAINT pk_{filled} TO pk_usage_rollups")


def upgrade() -> None:
    with op.batch_alter_table("invocations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("bytes_in", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("bytes_out", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("usage_events", schema=None) as batch_op:
        for name in ("bytes_in", "bytes_out"):
            batch_op.add_column(
                sa.Column(name, sa.BigInteger(), nullable=False, server_default="0")
            )
        batch_op.add_column(sa.Column("retries", sa.Integer(), nullable=False, server_default="0"))
    _rollups("usage_rollups_next", dimensions=True)
    counters = ", ".join(("events", "failures", *SUMS))
    op.execute(
        f"INSERT INTO usage_rollups_next (tenant_id, hour, kind, {', '.join(DIMENSIONS)},"
        f" {counters}, bytes_in, bytes_out, retries)"
        f" SELECT tenant_id, hour, kind, '', '', '', {counters}, 0, 0, 0 FROM usage_rollups"
    )
    op.drop_table("usage_rollups")
    op.rename_table("usage_rollups_next", "usage_rollups")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "ALTER TABLE usage_rollups RENAME CONSTRAINT pk_usage_rollups_next TO pk_usage_rollups"
        )


def downgrade() -> None:
    _rollups("usage_rollups_prev", dimensions=False)
    counters = ", ".join(("events", "failures", *SUMS))
    sums = ", ".join(f"SUM({n})" for n in ("events", "failures", *SUMS))
    op.execute(
        f"INSERT INTO usage_rollups_prev (tenant_id, hour, kind, {counters})"
        f" SELECT tenant_id, hour, kind, {sums} FROM usage_rollups GROUP BY tenant_id, hour, kind"
    )
    op.drop_table("usage_rollups")
    op.rename_table("usage_rollups_prev", "usage_rollups")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "ALTER TABLE usage_rollups RENAME CONSTRAINT pk_usage_rollups_prev TO pk_usage_rollups"
        )
    with op.batch_alter_table("usage_events", schema=None) as batch_op:
        for name in ("retries", "bytes_out", "bytes_in"):
            batch_op.drop_column(name)
    with op.batch_alter_table("invocations", schema=None) as batch_op:
        batch_op.drop_column("bytes_out")
        batch_op.drop_column("bytes_in")
