"""invocation lifecycle: claim tokens and the dispatch outbox, usage events, one quota
spec, function language

* ``invocations.claim`` (fencing token of the current hand-out) and ``invocations.job``
  (the dispatch intent, kept while the row is open);
* ``usage_events`` (append-only) and hourly ``usage_rollups`` derived from them (the
  daily rows become rows at 00:00 of their day);
* ``quotas``: one JSON object of limits instead of a column per field;
* ``functions.runtime`` renamed ``language`` (it always held a language);
* ``nodes`` dropped: the placement catalogue lives in Redis (node reports), not here.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 20:00:00.000000
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, time

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

QUOTA_FIELDS = (
    ("max_concurrent_executions", sa.Integer()),
    ("max_concurrent_sandboxes", sa.Integer()),
    ("executions_per_second", sa.Float()),
    ("burst", sa.Integer()),
    ("cpu_seconds_per_day", sa.Float()),
    ("max_memory_mb", sa.Integer()),
    ("max_wall_seconds", sa.Float()),
    ("max_sandbox_lifetime_seconds", sa.Integer()),
)
COSTS = ("queue_ms", "setup_ms", "exec_ms", "teardown_ms", "cpu_ms")


def upgrade() -> None:
    with op.batch_alter_table("invocations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("claim", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("job", sa.Text(), nullable=True))

    with op.batch_alter_table("functions", schema=None) as batch_op:
        batch_op.alter_column(
            "runtime", new_column_name="language", existing_type=sa.String(length=32)
        )

    _quotas_to_json()
    _usage_to_events()
    op.drop_table("nodes")


def _quotas_to_json() -> None:
    conn = op.get_bind()
    rows = conn.execute(
        sa.text("SELECT tenant_id, " + ", ".join(f for f, _ in QUOTA_FIELDS) + " FROM quotas")
    ).all()
    with op.batch_alter_table("quotas", schema=None) as batch_op:
        batch_op.add_column(sa.Column("limits", sa.JSON(), nullable=True))
    quotas = sa.table("quotas", sa.column("tenant_id", sa.String()), sa.column("limits", sa.JSON()))
    for row in rows:
        limits = {name: getattr(row, name) for name, _ in QUOTA_FIELDS}
        conn.execute(
            quotas.update().where(quotas.c.tenant_id == row.tenant_id).values(limits=limits)
        )
    with op.batch_alter_table("quotas", schema=None) as batch_op:
        for name, _ in QUOTA_FIELDS:
            batch_op.drop_column(name)
        batch_op.alter_column("limits", existing_type=sa.JSON(), nullable=False)


def _usage_to_events() -> None:
    conn = op.get_bind()
    old = conn.execute(
        sa.text(
            "SELECT tenant_id, day, kind, invocations, failures, "
            + ", ".join(COSTS)
            + " FROM usage_rollups"
        )
    ).all()
    op.drop_table("usage_rollups")
    op.create_table(
        "usage_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=True),
        sa.Column("subject", sa.String(length=16), nullable=False),
        sa.Column("subject_id", sa.String(length=256), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("runtime", sa.String(length=32), nullable=True),
        sa.Column("language", sa.String(length=32), nullable=True),
        sa.Column("function_version_id", sa.String(length=32), nullable=True),
        sa.Column("node_id", sa.String(length=128), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=True),
        sa.Column("queue_ms", sa.Float(), nullable=False),
        sa.Column("setup_ms", sa.Float(), nullable=False),
        sa.Column("exec_ms", sa.Float(), nullable=False),
        sa.Column("teardown_ms", sa.Float(), nullable=False),
        sa.Column("cpu_ms", sa.Float(), nullable=False),
        sa.Column("peak_memory_kb", sa.BigInteger(), nullable=True),
        sa.Column("instance_seconds", sa.Float(), nullable=False),
        sa.Column("memory_mb_seconds", sa.Float(), nullable=False),
        sa.Column("rolled", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_events")),
    )
    with op.batch_alter_table("usage_events", schema=None) as batch_op:
        batch_op.create_index("ix_usage_events_rolled", ["rolled"], unique=False)
        batch_op.create_index(
            "ix_usage_events_tenant_time", ["tenant_id", "occurred_at"], unique=False
        )
        batch_op.create_index("ux_usage_events_subject", ["subject", "subject_id"], unique=True)
    rollups = op.create_table(
        "usage_rollups",
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("failures", sa.BigInteger(), nullable=False),
        *(sa.Column(name, sa.Float(), nullable=False) for name in COSTS),
        sa.Column("instance_seconds", sa.Float(), nullable=False),
        sa.Column("memory_mb_seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "hour", "kind", name=op.f("pk_usage_rollups")),
    )
    assert rollups is not None
    if old:
        op.bulk_insert(
            rollups,
            [
                {
                    "tenant_id": row.tenant_id,
                    "hour": datetime.combine(_as_date(row.day), time(0), tzinfo=UTC),
                    "kind": row.kind,
                    "events": row.invocations,
                    "failures": row.failures,
                    **{name: getattr(row, name) for name in COSTS},
                    "instance_seconds": 0.0,
                    "memory_mb_seconds": 0.0,
                }
                for row in old
            ],
        )


def _as_date(value: object) -> object:
    if isinstance(value, str):  # SQLite returns dates as text through sa.text()
        return datetime.fromisoformat(value).date()
    return value


def downgrade() -> None:
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
    conn = op.get_bind()
    hourly = conn.execute(
        sa.text(
            "SELECT tenant_id, hour, kind, events, failures, "
            + ", ".join(COSTS)
            + " FROM usage_rollups WHERE tenant_id != ''"
        )
    ).all()
    op.drop_table("usage_rollups")
    with op.batch_alter_table("usage_events", schema=None) as batch_op:
        batch_op.drop_index("ux_usage_events_subject")
        batch_op.drop_index("ix_usage_events_tenant_time")
        batch_op.drop_index("ix_usage_events_rolled")
    op.drop_table("usage_events")
    daily = op.create_table(
        "usage_rollups",
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("invocations", sa.BigInteger(), nullable=False),
        sa.Column("failures", sa.BigInteger(), nullable=False),
        *(sa.Column(name, sa.Float(), nullable=False) for name in COSTS),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_usage_rollups_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "day", "kind", name=op.f("pk_usage_rollups")),
    )
    days: dict[tuple[str, object, str], dict[str, object]] = {}
    for row in hourly:
        hour = datetime.fromisoformat(row.hour) if isinstance(row.hour, str) else row.hour
        key = (row.tenant_id, hour.date(), row.kind[:16])
        day = days.setdefault(
            key,
            {"tenant_id": key[0], "day": key[1], "kind": key[2], "invocations": 0, "failures": 0}
            | dict.fromkeys(COSTS, 0.0),
        )
        day["invocations"] = int(day["invocations"]) + row.events  # type: ignore[call-overload]
        day["failures"] = int(day["failures"]) + row.failures  # type: ignore[call-overload]
        for name in COSTS:
            day[name] = float(day[name]) + getattr(row, name)  # type: ignore[arg-type]
    if days:
        assert daily is not None
        op.bulk_insert(daily, list(days.values()))

    rows = conn.execute(sa.text("SELECT tenant_id, limits FROM quotas")).all()
    with op.batch_alter_table("quotas", schema=None) as batch_op:
        for name, type_ in QUOTA_FIELDS:
            batch_op.add_column(sa.Column(name, type_, nullable=True))
    for row in rows:
        limits = row.limits if isinstance(row.limits, dict) else json.loads(row.limits)
        conn.execute(
            sa.text(
                "UPDATE quotas SET "
                + ", ".join(f"{name} = :{name}" for name, _ in QUOTA_FIELDS)
                + " WHERE tenant_id = :tenant_id"
            ),
            {"tenant_id": row.tenant_id, **{name: limits[name] for name, _ in QUOTA_FIELDS}},
        )
    with op.batch_alter_table("quotas", schema=None) as batch_op:
        batch_op.drop_column("limits")
        for name, type_ in QUOTA_FIELDS:
            batch_op.alter_column(name, existing_type=type_, nullable=False)

    with op.batch_alter_table("functions", schema=None) as batch_op:
        batch_op.alter_column(
            "language", new_column_name="runtime", existing_type=sa.String(length=32)
        )
    with op.batch_alter_table("invocations", schema=None) as batch_op:
        batch_op.drop_column("job")
        batch_op.drop_column("claim")
