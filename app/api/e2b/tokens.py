"""Sandbox access tokens: what E2B's ``envdAccessToken`` and ``trafficAccessToken`` are.

A token reaches one sandbox's in-sandbox routes (envd, ``/files``, ``/health``, the code
interpreter) and nothing else: ``crl_sbt_<sandbox id>.<expiry>.<mac>``, the MAC an
HMAC-SHA256, under the gateways' shared secret, of the tenant, the sandbox and the expiry
(epoch seconds: the end of the sandbox's lifetime as the tenant's quota set it when the
token was handed out). ``app.api.e2b.auth`` accepts one only with ``E2b-Sandbox-Id`` naming
its sandbox, compares its MAC in constant time, and reads the sandbox's record: a token
ends when its sandbox stops, or at its expiry if sooner. Its prefix is not an API key's
(``crl_key_``), so the control plane, ``/v1`` and everything else refuse it as they
refuse any string that is not a key.

The secret is ``CORRAL_SANDBOX_TOKEN_SECRET`` (the same on every gateway of a cluster),
or, unset, one generated once into ``<data_dir>/sandbox-token-secret`` (mode 0600, as
``scripts/run`` keeps the admin key), never a constant: a gateway that shares no data dir
with the others must be given the setting.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "crl_sbt_"
SECRET_FILE = "sandbox-token-secret"
#: a configured secret shorter than this is refused (a generated one is 43 characters)
MIN_SECRET_LENGTH = 32
_TOKEN = re.compile(r"^crl_sbt_(sbx_[0-9a-f]{1,64})\.([0-9]{1,12})\.([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True, slots=True)
class Claim:
    """What a token says before its MAC is checked."""

    sandbox_id: str
    expires_at: int  #: epoch seconds
    mac: str


class SandboxTokens:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_SECRET_LENGTH:
            raise ValueError(f"the sandbox token secret must be {MIN_SECRET_LENGTH}+ bytes")
        self._secret = secret

    def _mac(self, tenant_id: str, sandbox_id: str, expires_at: int) -> str:
        message = f"corral sandbox token v1\0{tenant_id}\0{sandbox_id}\0{expires_at}".encode()
        digest = hmac.new(self._secret, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def mint(self, tenant_id: str, sandbox_id: str, *, expires_at: float) -> str:
        """The token of one sandbox of ``tenant_id``, good until ``expires_at``."""
        expiry = int(expires_at)
        return f"{PREFIX}{sandbox_id}.{expiry}.{self._mac(tenant_id, sandbox_id, expiry)}"

    @staticmethod
    def claim(token: str) -> Claim | None:
        """The sandbox and expiry a token names (not checked yet); None: not a token."""
        match = _TOKEN.match(token)
        if match is None:
            return None
        return Claim(match.group(1), int(match.group(2)), match.group(3))

    def valid(self, claim: Claim, *, tenant_id: str, now: float) -> bool:
        """The claim was minted here for ``tenant_id``'s sandbox and has not expired."""
        expected = self._mac(tenant_id, claim.sandbox_id, claim.expires_at)
        genuine = hmac.compare_digest(expected.encode(), claim.mac.encode())
        return genuine and now < claim.expires_at


def is_token(presented: str) -> bool:
    return presented.startswith(PREFIX)


def load_secret(configured: str | None, data_dir: Path) -> bytes:
    """The configured secret, else the one kept in ``data_dir`` (made once, mode 0600)."""
    if configured is not None:
        if len(configured) < MIN_SECRET_LENGTH:
            raise ValueError(
                f"CORRAL_SANDBOX_TOKEN_SECRET must be at least {MIN_SECRET_LENGTH} characters"
            )
        return configured.encode()
    path = data_dir / SECRET_FILE
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    staged = path.with_name(f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
        try:
            os.link(staged, path)  # whole or absent: another process may be making it too
            log.info("sandbox access tokens: a secret was generated in %s", path)
        except FileExistsError:
            pass
    finally:
        staged.unlink(missing_ok=True)
    return _read(path)


def _read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as f:
        if os.fstat(f.fileno()).st_mode & 0o077:
            os.fchmod(f.fileno(), 0o600)
        secret = f.read().strip()
    if len(secret) < MIN_SECRET_LENGTH:
        raise ValueError(f"{path} holds no usable secret (delete it to have one generated)")
    return secret.encode()
