"""Corral's one settings object.

Built once by the app factory (or the CLI) from ``CORRAL_*`` environment variables and
passed down; nothing reads configuration at import time.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.quotas.spec import QuotaDefaults
from app.usage.prices import Prices
from node.settings import NodeSettings
from wire.sandboxes import MAX_FILE_BYTES

#: Admin keys that are refused outside dev mode.
WEAK_ADMIN_KEYS = frozenset({"", "admin", "changeme", "changethis", "secret", "password", "corral"})
MIN_ADMIN_KEY_LENGTH = 24


class DatabaseSettings(BaseSettings):
    """Where the database is: all that ``corral db upgrade`` needs (no admin key)."""

    model_config = SettingsConfigDict(env_prefix="CORRAL_", extra="ignore")

    data_dir: Path = Field(Path("var"), description="Where the embedded database and jails live.")
    database_url: str | None = Field(
        None,
        description="SQLAlchemy URL; default: SQLite file under data_dir. "
        "postgresql:// URLs are rewritten to the asyncpg driver.",
    )

    @property
    def resolved_database_url(self) -> str:
        url = self.database_url or f"sqlite+aiosqlite:///{self.data_dir.resolve()}/corral.db"
        for prefix in ("postgresql://", "postgres://", "postgresql+psycopg2://"):
            if url.startswith(prefix):
                return "postgresql+asyncpg://" + url[len(prefix) :]
        if url.startswith("sqlite://") and not url.startswith("sqlite+aiosqlite://"):
            return "sqlite+aiosqlite://" + url[len("sqlite://") :]
        return url


class Settings(DatabaseSettings):
    """Everything configurable about a gateway (the control plane).

    ``node`` holds the settings of the node agent that ``corral serve`` embeds; a
    separate ``corral node`` reads ``node.settings.NodeSettings`` alone.
    """

    model_config = SettingsConfigDict(env_prefix="CORRAL_", extra="ignore")

    dev_mode: bool = Field(
        False, description="Allow a missing admin key and the fake runtime. Never in production."
    )
    admin_key: SecretStr | None = Field(None, description="Key for the /v1/tenants admin API.")
    sandbox_token_secret: SecretStr | None = Field(
        None,
        description="Secret under which sandbox access tokens (E2B's envdAccessToken) are "
        "signed: the same random string (32+ characters) on every gateway of a cluster. "
        "Unset: one generated once into <data_dir>/sandbox-token-secret (mode 0600), "
        "which serves gateways that share that directory (the embedded default).",
    )
    redis_url: str | None = Field(
        None, description="When set: Redis Streams dispatch and Redis quota counters."
    )
    host: str = Field("127.0.0.1", description="Listen address of the API (always needs a key).")
    port: int = Field(8080, ge=0, le=65535)
    trusted_proxies: str | None = Field(
        None,
        description="Comma-separated addresses or networks of reverse proxies whose "
        "X-Forwarded-For and X-Forwarded-Proto are believed. Unset: those headers are "
        "ignored and the peer address is the client's.",
    )
    max_body_bytes: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        description="The largest request body, on every route but a file upload's (those "
        "stream, bounded by max_file_bytes).",
    )
    max_file_bytes: int = Field(
        MAX_FILE_BYTES,
        ge=1024,
        le=MAX_FILE_BYTES,
        description="The largest file one upload writes or one download reads (a sandbox's "
        "disk bounds it too: a full one is 507 disk_full). At most the nodes' own bound.",
    )
    e2b_sandbox_memory_mb: int = Field(
        512,
        ge=32,
        le=262_144,
        description="Memory of a sandbox made through E2B's API (its create names none; "
        "E2B's templates carry it). A sandbox's files count against its memory, so this "
        "bounds what its files hold together too.",
    )
    e2b_sandbox_disk_mb: int = Field(
        1024, ge=16, le=1_048_576, description="Writable layer of a sandbox made through E2B's API."
    )
    transfer_idle_seconds: float = Field(
        60.0,
        gt=0,
        description="How long a file transfer may wait on its client: an upload for its next "
        "bytes (else 408 upload_stalled), a download for it to take the next ones (else "
        "the connection is closed); either way its transfer slot is freed.",
    )
    auth_cache_seconds: float = Field(
        2.0, ge=0, description="How long a verified API key is trusted without a database read."
    )
    auth_cache_size: int = Field(
        10_000,
        ge=0,
        description="Verified keys a gateway remembers (least recently used first out; 0: "
        "every request reads its key).",
    )
    auth_revocation_check_seconds: float = Field(
        0.1,
        ge=0,
        description="Cluster: how stale a gateway's view of revocations may be. A key revoked "
        "(or a tenant disabled) on any gateway is refused on every other within this time: "
        "each checks a Redis counter at most this often before trusting a cached key.",
    )
    function_cache_seconds: float = Field(
        1.0,
        ge=0,
        description="How long a function's row (its aliases, latest, deletion) is trusted "
        "without a database read; changes made through this gateway apply at once, another "
        "gateway's within this time (versions are immutable and cached without limit).",
    )
    default_tenant: str | None = Field(
        None,
        description="Name of the tenant that keyless SandboxFusion-style requests act as "
        "(created at start-up if missing). Keyless requests are served only on the keyless "
        "listener (keyless_port, keyless_socket); unset: every request needs a key.",
    )
    keyless_host: str = Field(
        "127.0.0.1", description="Loopback address of the keyless listener (an IP literal)."
    )
    keyless_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Port of the keyless listener: /run_code without a key acts as "
        "default_tenant there, and only there. 0: any free port. Unset: no such port.",
    )
    keyless_socket: Path | None = Field(
        None,
        description="Unix socket of the keyless listener (created mode 0600: only this "
        "user may connect). Unset: no such socket.",
    )
    run_migrations: bool = Field(True, description="Run `alembic upgrade head` at startup.")
    images_dir: Path | None = Field(
        None,
        description="The control plane's image store (images), filled by `corral "
        "images build|import` on this host: creates resolve image names here and send "
        "nodes the digest, which nodes fetch from here when they lack it. Default: the "
        "embedded node's (<data_dir>/images), so `corral serve` keeps one store.",
    )

    # --- admission ---------------------------------------------------------------------
    admission_queue_seconds: float = Field(
        30.0, ge=0, description="How long work over the concurrency quota waits before a 429."
    )
    admission_queue_depth: int = Field(
        1024, ge=0, description="Per-tenant bound on work waiting for a concurrency slot."
    )

    # --- dispatch, placement and the lifecycle --------------------------------------
    heartbeat_seconds: float = Field(1.0, gt=0, description="How often a gateway reports.")
    node_dead_after_seconds: float = Field(
        6.0,
        gt=0,
        description="A node or gateway silent this long is dead: its work is handed out "
        "again, its results stream adopted.",
    )
    max_attempts: int = Field(
        2,
        ge=1,
        description="Hand-outs of an execution that started on a node before it is failed "
        "as lost instead of run again.",
    )
    result_wait_grace_seconds: float = Field(
        15.0, ge=0, description="Extra wait, beyond the execution's own limits, for a result."
    )
    record_retry_seconds: float = Field(
        10.0,
        ge=0,
        description="How long a gateway keeps asking a database that lost the connection "
        "while an invocation was being committed whether it was recorded, before it answers "
        "503 database_unavailable with details.recorded = unknown.",
    )
    record_tries: int = Field(
        5,
        ge=1,
        description="Tries of a node result's write (with backoff) before the result goes to "
        "the dead letters and its invocation ends errored (result_not_stored). A database "
        "that cannot be reached is waited for instead: it never counts.",
    )
    placement_choices: int = Field(3, ge=1, description="Nodes sampled per placement (best of k).")
    catalogue_seconds: float = Field(
        0.5, gt=0, description="How long the gateway trusts its copy of the node reports."
    )
    max_queued_per_runtime: int = Field(
        10_000,
        ge=1,
        description="Work waiting for any node of a runtime before new work gets 503 no_capacity.",
    )
    queue_seconds: float = Field(
        600.0,
        gt=0,
        description="How long work may wait for a node before it is handed out again.",
    )
    reconcile_seconds: float = Field(
        1.0,
        gt=0,
        description="Period of the leader's invocation, gateway, node and roll-up jobs, and "
        "how often a gateway asks whether it leads (app/leader.py).",
    )
    sandbox_meter_seconds: float = Field(
        60.0,
        ge=0,
        description="A live sandbox's usage is recorded (one usage event) once this long has "
        "passed since its last record, at the leader's next sandbox sync; a sandbox that ends "
        "gets its last interval at once.",
    )
    sandbox_sync_seconds: float = Field(
        1.0,
        gt=0,
        description="Period of the leader's sandbox sync (sandbox records against the "
        "nodes' inventories, and metering); a job of its own: a slow node never delays "
        "the judging of invocations.",
    )
    storage_meter_seconds: float = Field(
        300.0,
        gt=0,
        description="How often what each tenant keeps stored (large outputs, function "
        "artifacts, snapshots) is sampled into a usage event, priced per GB-month.",
    )
    reconcile_grace_seconds: float = Field(
        5.0,
        gt=0,
        description="Age of an open invocation before the reconciler judges its hand-out.",
    )
    stuck_grace_seconds: float = Field(
        60.0,
        gt=0,
        description="A claimed execution still open this long past its own time limits is "
        "treated as lost, even on a live node.",
    )
    blob_retention_hours: float = Field(
        24.0,
        gt=0,
        description="How long the large parts of invocations (outputs, fetched files, code "
        "or stdin over 64 KiB) are kept; afterwards answers show their first 4 KiB.",
    )
    invocation_retention_days: float = Field(
        30.0, gt=0, description="How long finished invocations are kept."
    )
    usage_event_retention_days: float = Field(
        90.0,
        gt=0,
        description="How long usage events are kept once counted in the hourly rollups "
        "(the rollups are kept).",
    )
    retention_seconds: float = Field(
        60.0, gt=0, description="Period of the leader's retention job."
    )
    max_batch_response_bytes: int = Field(
        32 * 1024 * 1024,
        ge=0,
        description="Large outputs one batch answer includes in full; past it, items show "
        "their first 4 KiB and name what they leave out (GET each invocation for it).",
    )
    failpoints: dict[str, str] = Field(
        default_factory=dict,
        description="Dev mode only: faults to inject at named points (app/failpoints.py), "
        'e.g. CORRAL_FAILPOINTS=\'{"invocations.after_commit": "kill"}\'.',
    )

    quota: QuotaDefaults = Field(default_factory=QuotaDefaults)
    prices: Prices = Field(
        default_factory=Prices,
        description="What usage costs (GET /v1/usage), "
        "e.g. CORRAL_PRICES='{\"cpu_second\": 0.00002}'.",
    )
    node: NodeSettings = Field(
        default_factory=NodeSettings, description="The node agent `corral serve` embeds."
    )

    @model_validator(mode="after")
    def _check_admin_key(self) -> Self:
        if self.dev_mode:
            return self
        key = self.admin_key.get_secret_value() if self.admin_key else ""
        if key.lower() in WEAK_ADMIN_KEYS or len(key) < MIN_ADMIN_KEY_LENGTH:
            raise ValueError(
                "CORRAL_ADMIN_KEY must be set to a random string of at least "
                f"{MIN_ADMIN_KEY_LENGTH} characters (or set CORRAL_DEV_MODE=1 for development)"
            )
        if self.failpoints:
            raise ValueError("CORRAL_FAILPOINTS needs CORRAL_DEV_MODE=1")
        return self

    @model_validator(mode="after")
    def _check_listeners(self) -> Self:
        keyless = self.keyless_port is not None or self.keyless_socket is not None
        if keyless and not self.default_tenant:
            raise ValueError(
                "a keyless listener (CORRAL_KEYLESS_PORT or CORRAL_KEYLESS_SOCKET) needs "
                "CORRAL_DEFAULT_TENANT, the tenant keyless requests act as"
            )
        try:
            loopback = ipaddress.ip_address(self.keyless_host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(
                f"CORRAL_KEYLESS_HOST must be a loopback IP address (127.0.0.1 or ::1), not "
                f"{self.keyless_host!r}: keyless access must never be reachable from another host"
            )
        if self.keyless_port and self.keyless_port == self.port:
            raise ValueError("CORRAL_KEYLESS_PORT must differ from CORRAL_PORT")
        for entry in self.proxies:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"CORRAL_TRUSTED_PROXIES: {entry!r} is not an IP address or network"
                ) from None
        return self

    @property
    def resolved_images_dir(self) -> Path:
        return self.images_dir if self.images_dir is not None else self.node.resolved_images_dir

    @property
    def proxies(self) -> list[str]:
        """The trusted proxies, as a list (empty: proxy headers are ignored)."""
        return [p.strip() for p in (self.trusted_proxies or "").split(",") if p.strip()]

    @property
    def hold_seconds(self) -> float:
        """How long a claimed dispatch marker outlives the execution's own limits: past the
        point where the reconciler treats it as stuck."""
        return self.stuck_grace_seconds * 2
