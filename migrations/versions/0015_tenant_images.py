"""tenant_images: images tenants build through the API (a snapshot and its config)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 18:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tenant_images",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("snapshot_id", sa.String(length=32), nullable=False),
        sa.Column("parent", sa.String(length=256), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("user", sa.String(length=64), nullable=False),
        sa.Column("workdir", sa.String(length=4096), nullable=False),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_tenant_images_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenant_images")),
    )
    with op.batch_alter_table("tenant_images", schema=None) as batch_op:
        batch_op.create_index(
            "uq_tenant_images_live_name",
            ["tenant_id", "name"],
            unique=True,
            sqlite_where=sa.text("deleted_at IS NULL"),
            postgresql_where=sa.text("deleted_at IS NULL"),
        )


def downgrade() -> None:
    with op.batch_alter_table("tenant_images", schema=None) as batch_op:
        batch_op.drop_index("uq_tenant_images_live_name")
    op.drop_table("tenant_images")
