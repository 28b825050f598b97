"""Corral's one settings object.

Built once by the app factory (or the CLI) from ``CORRAL_*`` environment variables and
passed down; nothing reads configuration at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Admin keys that are refused outside dev mode.
WEAK_ADMIN_KEYS = frozenset({"", "admin", "changeme", "changethis", "secret", "password", "corral"})
MIN_ADMIN_KEY_LENGTH = 24


class QuotaDefaults(BaseSettings):
    """Quotas given to a new tenant unless the admin says otherwise."""

    model_config = SettingsConfigDict(env_prefix="CORRAL_QUOTA_", extra="ignore")

    max_concurrent_executions: int = Field(16, ge=1)
    max_concurrent_sandboxes: int = Field(8, ge=0)
    executions_per_second: float = Field(200.0, gt=0)
    burst: int = Field(400, ge=1, description="token-bucket size for executions_per_second")
    cpu_seconds_per_day: float = Field(86_400.0, gt=0)
    max_memory_mb: int = Field(1024, ge=16)
    max_wall_seconds: float = Field(60.0, gt=0)
    max_sandbox_lifetime_seconds: int = Field(3600, ge=1)


class Settings(BaseSettings):
    """Everything configurable about a Corral process (gateway, node or both)."""

    model_config = SettingsConfigDict(env_prefix="CORRAL_", extra="ignore")

    dev_mode: bool = Field(
        False, description="Allow a missing admin key and the fake runtime. Never in production."
    )
    admin_key: SecretStr | None = Field(None, description="Key for the /v1/tenants admin API.")
    data_dir: Path = Field(Path("var"), description="Where the embedded database and jails live.")
    database_url: str | None = Field(
        None,
        description="SQLAlchemy URL; default: SQLite file under data_dir. "
        "postgresql:// URLs are rewritten to the asyncpg driver.",
    )
    redis_url: str | None = Field(
        None, description="When set: Redis Streams dispatch and Redis quota counters."
    )
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    auth_cache_seconds: float = Field(
        2.0, ge=0, description="How long a verified API key is trusted without a database read."
    )
    default_tenant: str | None = Field(
        None,
        description="Name of the tenant that keyless SandboxFusion-style requests act as "
        "(created at start-up if missing). Unset: every request needs a key.",
    )
    default_tenant_loopback_only: bool = Field(
        True, description="Accept keyless requests only from loopback clients."
    )
    run_migrations: bool = Field(True, description="Run `alembic upgrade head` at startup.")

    # --- admission ---------------------------------------------------------------------
    admission_queue_seconds: float = Field(
        30.0, ge=0, description="How long work over the concurrency quota waits before a 429."
    )
    admission_queue_depth: int = Field(
        1024, ge=0, description="Per-tenant bound on work waiting for a concurrency slot."
    )

    # --- dispatch and node -------------------------------------------------------------
    node_id: str | None = Field(None, description="Default: hostname-pid.")
    node_slots: int = Field(8, ge=1, description="Executions a node runs at once.")
    runtimes: list[str] = Field(
        default_factory=lambda: ["nsjail", "wasm"], description="Backends this node starts."
    )
    heartbeat_seconds: float = Field(2.0, gt=0)
    node_dead_after_seconds: float = Field(
        6.0, gt=0, description="A node silent this long is dead; its work is reclaimed."
    )
    max_attempts: int = Field(
        2, ge=1, description="Deliveries of one execution before it is failed as lost."
    )
    result_wait_grace_seconds: float = Field(
        15.0, ge=0, description="Extra wait, beyond the execution's own limits, for a result."
    )

    quota: QuotaDefaults = Field(default_factory=QuotaDefaults)
    wasm: dict[str, Any] = Field(
        default_factory=dict,
        description="Overrides for the wasm backend (runtimes/wasm/config.py), as JSON: "
        "e.g. CORRAL_WASM='{\"warm_per_language\": 2}'.",
    )
    nsjail: dict[str, Any] = Field(
        default_factory=dict,
        description="Overrides for the nsjail backend (runtimes/nsjail/config.py), as JSON: "
        'e.g. CORRAL_NSJAIL=\'{"max_jails": 64, "warm_per_language": 2}\'.',
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
        if "fake" in self.runtimes:
            raise ValueError("the fake runtime is for tests only; it needs CORRAL_DEV_MODE=1")
        return self

    @property
    def resolved_database_url(self) -> str:
        url = self.database_url or f"sqlite+aiosqlite:///{self.data_dir.resolve()}/corral.db"
        for prefix in ("postgresql://", "postgres://", "postgresql+psycopg2://"):
            if url.startswith(prefix):
                return "postgresql+asyncpg://" + url[len(prefix) :]
        if url.startswith("sqlite://") and not url.startswith("sqlite+aiosqlite://"):
            return "sqlite+aiosqlite://" + url[len("sqlite://") :]
        return url

    @property
    def resolved_node_id(self) -> str:
        if self.node_id:
            return self.node_id
        import os
        import socket

        return f"{socket.gethostname()}-{os.getpid()}"
