"""dead_letters: node reports the recorder could not store after its tries

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dead_letters",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gateway_id", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("invocation_id", sa.String(length=32), nullable=True),
        sa.Column("node_id", sa.String(length=128), nullable=True),
        sa.Column("tries", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dead_letters")),
    )
    with op.batch_alter_table("dead_letters", schema=None) as batch_op:
        batch_op.create_index("ix_dead_letters_created", ["created_at"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_dead_letters_invocation_id"), ["invocation_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("dead_letters", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_dead_letters_invocation_id"))
        batch_op.drop_index("ix_dead_letters_created")
    op.drop_table("dead_letters")
