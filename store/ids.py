"""Identifiers: time-ordered ids for rows, secret keys for rollouts and their stored hashes."""

from __future__ import annotations

import hashlib
import os
import secrets
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]
"""Two digits for each 10 bits: half the steps of a digit at a time."""
_SHIFTS = range(120, -1, -10)
KEY_PREFIX = "rk-"


def new_id() -> str:
    """A 26-character ULID: 48 bits of milliseconds then 80 random bits, so ids sort by time."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in _SHIFTS])


def new_key() -> str:
    """A secret rollout key, safe in a URL path and in an API-key header."""
    return KEY_PREFIX + secrets.token_urlsafe(24)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def body_hash(body: bytes) -> str:
    return hashlib.blake2b(body, digest_size=16).hexdigest()
