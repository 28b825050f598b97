"""console_sessions: signed-in web consoles (a token's SHA-256, who, the CSRF token)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=8), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=True),
        sa.Column("key_id", sa.String(length=32), nullable=True),
        sa.Column("admin_fingerprint", sa.String(length=64), nullable=True),
        sa.Column("csrf", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_console_sessions")),
    )
    with op.batch_alter_table("console_sessions", schema=None) as batch_op:
        batch_op.create_index("ix_console_sessions_expires", ["expires_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("console_sessions", schema=None) as batch_op:
        batch_op.drop_index("ix_console_sessions_expires")
    op.drop_table("console_sessions")
