"""usage: GB-seconds stored (large outputs, function artifacts, snapshots), per event
and per rollup

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

TABLES = ("usage_events", "usage_rollups")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(
                sa.Column("stored_gb_seconds", sa.Float(), nullable=False, server_default="0")
            )


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("stored_gb_seconds")
