"""sandboxes.accelerator: what runs a microVM sandbox's machine (kvm, tcg)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 02:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("accelerator", sa.String(length=8), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("accelerator")
