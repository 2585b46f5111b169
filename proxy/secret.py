"""The proxy's signing secret: configured, or generated once and kept beside the database.

References the proxy hands to clients (thinking signatures, `encrypted_content`) are signed with
it, so it must outlive the process: a harness resending its history to a restarted proxy must
still be understood. Where it comes from, first match wins:

1. `ProxySettings.secret` (`ROLLTAP_SECRET`): any string; every proxy sharing one database
   (several hosts on one PostgreSQL) must be given the same one.
2. A file of 32 random bytes (hex), created on first start with mode 0600: beside a SQLite
   database as `<database file>.secret`, otherwise (PostgreSQL) in the user's rolltap data
   directory as `proxy.secret`.

Only keys derived from it are kept in memory; neither is ever logged. Each use derives its own
key under its own context (handles, signed exports), so a signature of one kind never passes for
another.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from pathlib import Path

import platformdirs

from ..store.url import DatabaseURL

_CONTEXT = b"rolltap proxy handles v1\0"
_EXPORTS = b"rolltap export signatures v1\0"


def secret_path(db_url: DatabaseURL) -> Path:
    if db_url.is_sqlite:
        path = db_url.sqlite_path
        return path.with_name(path.name + ".secret")
    return platformdirs.user_data_path("rolltap") / "proxy.secret"


def signing_key(configured: str | None, db_url: DatabaseURL) -> bytes:
    """The HMAC key: from the configured secret, else from the persisted one."""
    material = configured.encode() if configured else _persisted(secret_path(db_url))
    return hashlib.sha256(_CONTEXT + material).digest()


def export_key(configured: str | None, db_url: DatabaseURL, *, create: bool = True) -> bytes | None:
    """The HMAC key of signed exports (`rolltap export --sign`); None when no secret is
    configured and none is kept yet, and `create` is False (checking a signature must not make
    up a secret it could never match)."""
    if configured:
        material = configured.encode()
    else:
        path = secret_path(db_url)
        if not create and not path.exists():
            return None
        material = _persisted(path)
    return hashlib.sha256(_EXPORTS + material).digest()


def _persisted(path: Path) -> bytes:
    with contextlib.suppress(FileNotFoundError):
        return _read(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        # A hard link appears whole or not at all, and never replaces a file another process
        # linked first: every proxy starting at once ends up with the same secret.
        with contextlib.suppress(FileExistsError):
            os.link(draft, path)
    finally:
        draft.unlink()
    return _read(path)


def _read(path: Path) -> bytes:
    text = path.read_text().strip()
    if len(text) < 32:
        raise ValueError(f"{path} holds no usable secret; delete it to generate a new one")
    return text.encode()
