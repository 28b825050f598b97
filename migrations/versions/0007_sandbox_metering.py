"""sandboxes: how far each one's usage is recorded (metered_until, metered_cpu_ms), and an
index on ended_at for the metering pass's catch-up of sandboxes that just ended

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sandboxes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("metered_until", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("metered_cpu_ms", sa.Float(), nullable=True))
        batch_op.create_index("ix_sandboxes_ended", ["ended_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("sandboxes", schema=None) as batch_op:
        batch_op.drop_index("ix_sandboxes_ended")
        batch_op.drop_column("metered_cpu_ms")
        batch_op.drop_column("metered_until")
