"""tenants: deleted_at (deleted by the operator: disabled for good, keys revoked,
sandboxes ended) and purged_at (its content removed too: app.tenants.deletion)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 17:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.add_column(sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("purged_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.drop_column("purged_at")
        batch_op.drop_column("deleted_at")
