"""The schema, as SQLAlchemy 2 declarative models.

Alembic migrations (``migrations/``) are the only thing that creates tables; these
models describe them for queries and for ``alembic revision --autogenerate``.
Identifiers are prefixed random strings (``ten_…``, ``inv_…``) made by ``wire.ids``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


class Tenant(Base):
    """A tenant. ``deleted_at``: the operator deleted it (disabled for good, its keys
    revoked, its sandboxes ended); ``purged_at``: its content was removed too, nothing
    being left to remove (``app.tenants.deletion``)."""

    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)
    purged_at: Mapped[datetime | None] = mapped_column(default=None)

    quota: Mapped[Quota] = relationship(back_populates="tenant", lazy="joined")


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128), default="")
    secret_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)
    last_used_at: Mapped[datetime | None] = mapped_column(default=None)


class Quota(Base):
    """A tenant's quota: the fields of ``app.quotas.spec.QuotaLimits``, as one JSON object
    (the field list is declared there and nowhere else)."""

    __tablename__ = "quotas"

    tenant_id: Mapped[str] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    limits: Mapped[dict[str, Any]] = mapped_column(default=dict)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    tenant: Mapped[Tenant] = relationship(back_populates="quota")


class Function(Base):
    __tablename__ = "functions"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    language: Mapped[str] = mapped_column(String(32))
    aliases: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)


class FunctionVersion(Base):
    __tablename__ = "function_versions"
    __table_args__ = (UniqueConstraint("function_id", "version"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    function_id: Mapped[str] = mapped_column(
        ForeignKey("functions.id", ondelete="CASCADE"), index=True
    )
    version: Mapped[int] = mapped_column(Integer)
    content_hash: Mapped[str] = mapped_column(String(64))
    language: Mapped[str] = mapped_column(String(32))
    entry_point: Mapped[str] = mapped_column(String(128), default="")
    input_schema: Mapped[dict[str, Any]] = mapped_column(default=dict)
    limits: Mapped[dict[str, Any]] = mapped_column(default=dict)
    artifact_path: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class FunctionArtifact(Base):
    """The bytes a function version runs (source text as UTF-8, or a ``.wasm`` module).

    Keyed by tenant and SHA-256 of the content, so versions with the same content share
    one row, and held in the database so that any gateway can hand them to a node (inside
    the Job: nodes have no database).
    """

    __tablename__ = "function_artifacts"

    tenant_id: Mapped[str] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    content_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    content: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Invocation(Base):
    """One execution: queued by a gateway, run by a node, stored by a recorder.

    ``claim`` is the fencing token of the current hand-out (``attempts`` counts them);
    ``job`` is the dispatch intent, the Job as JSON, written with the row and cleared when
    the row becomes final: what the reconciler sends again if the hand-out is lost.
    """

    __tablename__ = "invocations"
    __table_args__ = (
        Index("ix_invocations_tenant_created", "tenant_id", "created_at"),
        Index("ix_invocations_status", "status"),
        Index("ix_invocations_created", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))  # run | function
    runtime: Mapped[str | None] = mapped_column(String(32), default=None)
    language: Mapped[str | None] = mapped_column(String(32), default=None)
    function_version_id: Mapped[str | None] = mapped_column(String(32), default=None)
    status: Mapped[str] = mapped_column(String(16))  # queued running succeeded failed errored
    error: Mapped[str | None] = mapped_column(Text, default=None)
    node_id: Mapped[str | None] = mapped_column(String(128), default=None)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    claim: Mapped[str | None] = mapped_column(String(32), default=None)
    job: Mapped[str | None] = mapped_column(Text, default=None)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    stdout: Mapped[str] = mapped_column(Text, default="")
    stderr: Mapped[str] = mapped_column(Text, default="")
    stdout_truncated: Mapped[bool] = mapped_column(Boolean, default=False)
    stderr_truncated: Mapped[bool] = mapped_column(Boolean, default=False)
    request: Mapped[dict[str, Any]] = mapped_column(default=dict)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    queued_at: Mapped[datetime | None] = mapped_column(default=None)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    queue_ms: Mapped[float | None] = mapped_column(Float, default=None)
    setup_ms: Mapped[float | None] = mapped_column(Float, default=None)
    exec_ms: Mapped[float | None] = mapped_column(Float, default=None)
    teardown_ms: Mapped[float | None] = mapped_column(Float, default=None)
    cpu_ms: Mapped[float | None] = mapped_column(Float, default=None)
    peak_memory_kb: Mapped[int | None] = mapped_column(BigInteger, default=None)
    #: what the call carried in (its Job: code, stdin, files) and out (its output and files)
    bytes_in: Mapped[int | None] = mapped_column(BigInteger, default=None)
    bytes_out: Mapped[int | None] = mapped_column(BigInteger, default=None)


class Blob(Base):
    """A large part of an invocation (output, a fetched file, code or stdin) kept out of its
    row, for a limited time: the row keeps a preview and the blob's id. Counted against
    the tenant's ``max_storage_mb``; deleted once older than the blob retention
    (``CORRAL_BLOB_RETENTION_HOURS``), or with its invocation."""

    __tablename__ = "blobs"
    __table_args__ = (
        Index("ix_blobs_tenant", "tenant_id"),
        Index("ix_blobs_created", "created_at"),
        Index("ix_blobs_invocation", "invocation_id"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(32))
    invocation_id: Mapped[str] = mapped_column(ForeignKey("invocations.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(512))  # e.g. run.stdout, files/out.bin, code
    size: Mapped[int] = mapped_column(BigInteger)
    content: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column()


class UsageEvent(Base):
    """Append-only record of what was used: one row per finished invocation, per interval
    of a sandbox's life, and, from warm pools, per period of idle capacity (with no
    tenant: the platform pays for it).

    ``rolled`` is bookkeeping, not a fact: set once the event is counted in
    ``usage_rollups``.
    """

    __tablename__ = "usage_events"
    __table_args__ = (
        Index("ix_usage_events_tenant_time", "tenant_id", "occurred_at"),
        Index("ix_usage_events_rolled", "rolled"),
        Index("ux_usage_events_subject", "subject", "subject_id", unique=True),
    )

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    occurred_at: Mapped[datetime] = mapped_column()
    tenant_id: Mapped[str | None] = mapped_column(String(32), default=None)
    subject: Mapped[str] = mapped_column(String(16))  # invocation | pool | sandbox | storage
    subject_id: Mapped[str] = mapped_column(String(256))
    kind: Mapped[str] = mapped_column(String(32))  # run | function | pool_idle | sandbox | storage
    runtime: Mapped[str | None] = mapped_column(String(32), default=None)
    language: Mapped[str | None] = mapped_column(String(32), default=None)
    function_version_id: Mapped[str | None] = mapped_column(String(32), default=None)
    node_id: Mapped[str | None] = mapped_column(String(128), default=None)
    status: Mapped[str | None] = mapped_column(String(16), default=None)
    queue_ms: Mapped[float] = mapped_column(Float, default=0.0)
    setup_ms: Mapped[float] = mapped_column(Float, default=0.0)
    exec_ms: Mapped[float] = mapped_column(Float, default=0.0)
    teardown_ms: Mapped[float] = mapped_column(Float, default=0.0)
    cpu_ms: Mapped[float] = mapped_column(Float, default=0.0)
    peak_memory_kb: Mapped[int | None] = mapped_column(BigInteger, default=None)
    instance_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    memory_mb_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    #: GB (10^9 bytes) kept stored, times how long (``app.usage.storage``)
    stored_gb_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    bytes_in: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_out: Mapped[int] = mapped_column(BigInteger, default=0)
    retries: Mapped[int] = mapped_column(Integer, default=0)
    rolled: Mapped[bool] = mapped_column(Boolean, default=False)


class UsageRollup(Base):
    """Per tenant (``""``: the platform), UTC hour, kind, runtime (the backend), language
    and function version (``""`` where an event has none): the sums of usage events."""

    __tablename__ = "usage_rollups"

    tenant_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    hour: Mapped[datetime] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(32), primary_key=True)
    runtime: Mapped[str] = mapped_column(String(32), primary_key=True, default="")
    language: Mapped[str] = mapped_column(String(32), primary_key=True, default="")
    function_version_id: Mapped[str] = mapped_column(String(32), primary_key=True, default="")
    events: Mapped[int] = mapped_column(BigInteger, default=0)
    failures: Mapped[int] = mapped_column(BigInteger, default=0)
    queue_ms: Mapped[float] = mapped_column(Float, default=0.0)
    setup_ms: Mapped[float] = mapped_column(Float, default=0.0)
    exec_ms: Mapped[float] = mapped_column(Float, default=0.0)
    teardown_ms: Mapped[float] = mapped_column(Float, default=0.0)
    cpu_ms: Mapped[float] = mapped_column(Float, default=0.0)
    instance_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    memory_mb_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    #: GB (10^9 bytes) kept stored, times how long (``app.usage.storage``)
    stored_gb_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    bytes_in: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_out: Mapped[int] = mapped_column(BigInteger, default=0)
    retries: Mapped[int] = mapped_column(BigInteger, default=0)


class Sandbox(Base):
    """One stateful sandbox: its request, where it lives, and how it ended.

    ``state`` follows the node's (creating, running, paused, stopped); ``node_id`` is the
    node that holds it, to which every operation is routed. ``spec`` is the request less
    the env values (which can be secrets; only their names are kept). ``metered_until``
    and ``metered_cpu_ms`` say how far its usage events go (``app.sandboxes.metering``).
    ``version`` grows by one at each transition: every writer moves the row only from the
    version it read (``app.db.sandboxes``).
    """

    __tablename__ = "sandboxes"
    __table_args__ = (
        Index("ix_sandboxes_tenant_state", "tenant_id", "state"),
        Index("ix_sandboxes_state", "state"),
        Index("ix_sandboxes_ended", "ended_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    backend: Mapped[str] = mapped_column(String(16))
    image: Mapped[str] = mapped_column(String(256))
    image_digest: Mapped[str | None] = mapped_column(String(80), default=None)
    node_id: Mapped[str | None] = mapped_column(String(128), default=None)
    state: Mapped[str] = mapped_column(String(16))
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)
    meta: Mapped[dict[str, Any]] = mapped_column(default=dict)
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    #: what runs a microVM's machine (kvm, tcg); None for a container
    accelerator: Mapped[str | None] = mapped_column(String(8), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    expires_at: Mapped[datetime | None] = mapped_column(default=None)
    ended_at: Mapped[datetime | None] = mapped_column(default=None)
    queue_ms: Mapped[float | None] = mapped_column(Float, default=None)
    image_ms: Mapped[float | None] = mapped_column(Float, default=None)
    setup_ms: Mapped[float | None] = mapped_column(Float, default=None)
    start_ms: Mapped[float | None] = mapped_column(Float, default=None)
    cpu_ms: Mapped[float | None] = mapped_column(Float, default=None)
    memory_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    metered_until: Mapped[datetime | None] = mapped_column(default=None)
    metered_cpu_ms: Mapped[float | None] = mapped_column(Float, default=None)
    version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class SandboxTotals(Base):
    """What a tenant's live sandboxes hold together: how many, and their memory, CPU
    (thousandths of a core) and disk. A create adds its sandbox here and a sandbox that
    stops being live takes itself off, each in the transaction that writes its row, so
    the totals always equal the sum over the tenant's live rows; a create is admitted by
    a conditional update of this one row (``app.db.sandboxes.admit``), which two
    gateways cannot both pass past the quota."""

    __tablename__ = "sandbox_totals"

    tenant_id: Mapped[str] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    live: Mapped[int] = mapped_column(Integer, default=0)
    memory_mb: Mapped[int] = mapped_column(BigInteger, default=0)
    cpu_milli: Mapped[int] = mapped_column(BigInteger, default=0)
    disk_mb: Mapped[int] = mapped_column(BigInteger, default=0)


class Snapshot(Base):
    """A copy of a sandbox's files, kept on the node that made it (where sandboxes made
    from it are placed)."""

    __tablename__ = "snapshots"
    __table_args__ = (Index("ix_snapshots_tenant", "tenant_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    sandbox_id: Mapped[str] = mapped_column(String(32))
    node_id: Mapped[str] = mapped_column(String(128))
    backend: Mapped[str] = mapped_column(String(16))
    image: Mapped[str] = mapped_column(String(256))
    image_digest: Mapped[str] = mapped_column(String(80))
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)


class TenantImage(Base):
    """An image a tenant built through the API (``app.images.build``): a snapshot of
    the build's sandbox (its files: the size counted in the tenant's storage) and the
    config a sandbox made from it starts with. Named once among the tenant's live images;
    nobody else sees it."""

    __tablename__ = "tenant_images"
    __table_args__ = (
        Index(
            "uq_tenant_images_live_name",
            "tenant_id",
            "name",
            unique=True,
            sqlite_where=text("deleted_at IS NULL"),
            postgresql_where=text("deleted_at IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    snapshot_id: Mapped[str] = mapped_column(String(32))
    #: the image it was built FROM: a catalogue image's name, or another of the tenant's
    parent: Mapped[str] = mapped_column(String(256))
    env: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    user: Mapped[str] = mapped_column(String(64))
    workdir: Mapped[str] = mapped_column(String(4096))
    #: ``{"cmd": [...] | None, "entrypoint": [...] | None}``, recorded as the Dockerfile said
    command: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)


class ConsoleSession(Base):
    """A signed-in web console: the browser holds a random token in an HttpOnly cookie,
    this row its SHA-256 and who signed in (never the key itself). A tenant's session
    acts through the key it signed in with (revoked or disabled: over); the operator's
    holds a fingerprint of the admin key it was made with (changed: over)."""

    __tablename__ = "console_sessions"
    __table_args__ = (Index("ix_console_sessions_expires", "expires_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  #: SHA-256 of the token
    role: Mapped[str] = mapped_column(String(8))  #: admin | tenant
    tenant_id: Mapped[str | None] = mapped_column(String(32), default=None)
    key_id: Mapped[str | None] = mapped_column(String(32), default=None)
    admin_fingerprint: Mapped[str | None] = mapped_column(String(64), default=None)
    csrf: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column()
    expires_at: Mapped[datetime] = mapped_column()


class DeadLetter(Base):
    """A node's report the recorder could not store after ``record_tries`` tries (a write
    that fails every time: ``app.invocations.recorder``): kept for the operator
    (``GET /v1/admin/dead-letters``), its invocation ended ``errored``, and the gateway's
    results stream moved on. ``event`` is the report as it arrived (its first 256 KiB)."""

    __tablename__ = "dead_letters"
    __table_args__ = (Index("ix_dead_letters_created", "created_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    gateway_id: Mapped[str] = mapped_column(String(128))  #: whose recorder gave up
    kind: Mapped[str] = mapped_column(String(16))  #: finished | started | stored | pool_usage
    invocation_id: Mapped[str | None] = mapped_column(String(32), default=None, index=True)
    node_id: Mapped[str | None] = mapped_column(String(128), default=None)
    tries: Mapped[int] = mapped_column(Integer)
    error: Mapped[str] = mapped_column(Text)  #: the last failure
    event: Mapped[str] = mapped_column(Text)
