"""API key format: ``crl_<key id>_<secret>``.

The key id is stored in clear (it names the key in listings and logs); the secret is
256 random bits, stored only as its SHA-256 (a slow hash buys nothing for a random
secret of that size). The whole key is shown once, when it is created.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

PREFIX = "crl"
_KEY_RE = re.compile(r"^crl_(key_[0-9a-f]{20})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True, slots=True)
class NewKey:
    key_id: str
    plaintext: str
    secret_hash: str


@dataclass(frozen=True, slots=True)
class ParsedKey:
    key_id: str
    secret: str


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def generate(key_id: str) -> NewKey:
    secret = secrets.token_urlsafe(32)
    return NewKey(key_id, f"{PREFIX}_{key_id}_{secret}", hash_secret(secret))


def parse(presented: str) -> ParsedKey | None:
    match = _KEY_RE.match(presented)
    if match is None:
        return None
    return ParsedKey(match.group(1), match.group(2))


def matches(parsed: ParsedKey, secret_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(parsed.secret), secret_hash)


def admin_matches(presented: str, admin_key: str) -> bool:
    return hmac.compare_digest(presented.encode(), admin_key.encode())
