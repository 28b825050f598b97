"""sandboxes: stateful sandboxes, where they live and how they ended (replaces the
unused placeholder table of 0001)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 23:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sandboxes", schema=None) as batch_op:
        batch_op.drop_index("ix_sandboxes_tenant_state")
    op.drop_table("sandboxes")
    op.create_table(
        "sandboxes",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("backend", sa.String(length=16), nullable=False),
        sa.Column("image", sa.String(length=256), nullable=False),
        sa.Column("image_digest", sa.String(length=80), nullable=True),
        sa.Column("node_id", sa.String(length=128), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("meta", sa.JSON(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("queue_ms", sa.Float(), nullable=True),
        sa.Column("image_ms", sa.Float(), nullable=True),
        sa.Column("setup_ms", sa.Float(), nullable=True),
        sa.Column("start_ms", sa.Float(), nullable=True),
        sa.Column("cpu_ms", sa.Float(), nullable=True),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_sandboxes_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sandboxes")),
    )
    with op.batch_alter_table("sandboxes", schema=None) as batch_op:
        batch_op.create_index("ix_sandboxes_tenant_state", ["tenant_id", "state"], unique=False)
        batch_op.create_index("ix_sandboxes_state", ["state"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("sandboxes", schema=None) as batch_op:
        batch_op.drop_index("ix_sandboxes_state")
        batch_op.drop_index("ix_sandboxes_tenant_state")
    op.drop_table("sandboxes")
    op.create_table(
        "sandboxes",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("backend", sa.String(length=32), nullable=False),
        sa.Column("image", sa.String(length=256), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("node_id", sa.String(length=128), nullable=True),
        sa.Column("limits", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_sandboxes_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sandboxes")),
    )
    with op.batch_alter_table("sandboxes", schema=None) as batch_op:
        batch_op.create_index("ix_sandboxes_tenant_state", ["tenant_id", "state"], unique=False)
