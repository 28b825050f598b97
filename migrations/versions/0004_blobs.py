"""blobs: large outputs, fetched files, code and stdin kept out of invocation rows, for a
limited time; invocations indexed by creation time for the retention pass

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 22:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "blobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("invocation_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=512), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["invocation_id"],
            ["invocations.id"],
            name=op.f("fk_blobs_invocation_id_invocations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_blobs")),
    )
    with op.batch_alter_table("blobs", schema=None) as batch_op:
        batch_op.create_index("ix_blobs_tenant", ["tenant_id"], unique=False)
        batch_op.create_index("ix_blobs_created", ["created_at"], unique=False)
        batch_op.create_index("ix_blobs_invocation", ["invocation_id"], unique=False)
    with op.batch_alter_table("invocations", schema=None) as batch_op:
        batch_op.create_index("ix_invocations_created", ["created_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("invocations", schema=None) as batch_op:
        batch_op.drop_index("ix_invocations_created")
    with op.batch_alter_table("blobs", schema=None) as batch_op:
        batch_op.drop_index("ix_blobs_invocation")
        batch_op.drop_index("ix_blobs_created")
        batch_op.drop_index("ix_blobs_tenant")
    op.drop_table("blobs")
