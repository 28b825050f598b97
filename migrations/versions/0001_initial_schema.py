"""initial schema

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-30 09:05:53.162599
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("address", sa.String(length=256), nullable=False),
        sa.Column("runtimes", sa.JSON(), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
    )
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_api_keys_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_keys_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "functions",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("runtime", sa.String(length=32), nullable=False),
        sa.Column("aliases", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_functions_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_functions")),
        sa.UniqueConstraint("tenant_id", "name", name=op.f("uq_functions_tenant_id")),
    )
    with op.batch_alter_table("functions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_functions_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "invocations",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("runtime", sa.String(length=32), nullable=True),
        sa.Column("language", sa.String(length=32), nullable=True),
        sa.Column("function_version_id", sa.String(length=32), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("node_id", sa.String(length=128), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("stdout", sa.Text(), nullable=False),
        sa.Column("stderr", sa.Text(), nullable=False),
        sa.Column("stdout_truncated", sa.Boolean(), nullable=False),
        sa.Column("stderr_truncated", sa.Boolean(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("queued_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("queue_ms", sa.Float(), nullable=True),
        sa.Column("setup_ms", sa.Float(), nullable=True),
        sa.Column("exec_ms", sa.Float(), nullable=True),
        sa.Column("teardown_ms", sa.Float(), nullable=True),
        sa.Column("cpu_ms", sa.Float(), nullable=True),
        sa.Column("peak_memory_kb", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_invocations_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_invocations")),
    )
    with op.batch_alter_table("invocations", schema=None) as batch_op:
        batch_op.create_index("ix_invocations_status", ["status"], unique=False)
        batch_op.create_index(
            "ix_invocations_tenant_created", ["tenant_id", "created_at"], unique=False
        )

    op.create_table(
        "quotas",
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("max_concurrent_executions", sa.Integer(), nullable=False),
        sa.Column("max_concurrent_sandboxes", sa.Integer(), nullable=False),
        sa.Column("executions_per_second", sa.Float(), nullable=False),
        sa.Column("burst", sa.Integer(), nullable=False),
        sa.Column("cpu_seconds_per_day", sa.Float(), nullable=False),
        sa.Column("max_memory_mb", sa.Integer(), nullable=False),
        sa.Column("max_wall_seconds", sa.Float(), nullable=False),
        sa.Column("max_sandbox_lifetime_seconds", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_quotas_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_quotas")),
    )
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

    op.create_table(
        "usage_rollups",
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("invocations", sa.BigInteger(), nullable=False),
        sa.Column("failures", sa.BigInteger(), nullable=False),
        sa.Column("queue_ms", sa.Float(), nullable=False),
        sa.Column("setup_ms", sa.Float(), nullable=False),
        sa.Column("exec_ms", sa.Float(), nullable=False),
        sa.Column("teardown_ms", sa.Float(), nullable=False),
        sa.Column("cpu_ms", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_usage_rollups_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "day", "kind", name=op.f("pk_usage_rollups")),
    )
    op.create_table(
        "function_versions",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("function_id", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("language", sa.String(length=32), nullable=False),
        sa.Column("entry_point", sa.String(length=128), nullable=False),
        sa.Column("input_schema", sa.JSON(), nullable=False),
        sa.Column("limits", sa.JSON(), nullable=False),
        sa.Column("artifact_path", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["function_id"],
            ["functions.id"],
            name=op.f("fk_function_versions_function_id_functions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_function_versions")),
        sa.UniqueConstraint(
            "function_id", "version", name=op.f("uq_function_versions_function_id")
        ),
    )
    with op.batch_alter_table("function_versions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_function_versions_function_id"), ["function_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("function_versions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_function_versions_function_id"))

    op.drop_table("function_versions")
    op.drop_table("usage_rollups")
    with op.batch_alter_table("sandboxes", schema=None) as batch_op:
        batch_op.drop_index("ix_sandboxes_tenant_state")

    op.drop_table("sandboxes")
    op.drop_table("quotas")
    with op.batch_alter_table("invocations", schema=None) as batch_op:
        batch_op.drop_index("ix_invocations_tenant_created")
        batch_op.drop_index("ix_invocations_status")

    op.drop_table("invocations")
    with op.batch_alter_table("functions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_functions_tenant_id"))

    op.drop_table("functions")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_tenant_id"))

    op.drop_table("api_keys")
    op.drop_table("tenants")
    op.drop_table("nodes")
