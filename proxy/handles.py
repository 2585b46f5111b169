"""Opaque, signed references from a client's history back to one recorded engine answer.

A handle names a call and a choice; its MAC also covers the rollout, so a handle from another
rollout, or one edited by anyone without the proxy's key, reads as invalid. It rides where the
client keeps opaque model state and sends it back: an Anthropic thinking block's `signature`, a
Responses reasoning item's `encrypted_content`.

Format: `rt1.` + base64url(call id (26 ASCII characters) + choice (1 byte) + MAC (16 bytes)), the
MAC being HMAC-SHA256 over the rollout id, call id and choice, truncated to 128 bits.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
from dataclasses import dataclass

PREFIX = "rt1."
_CALL_ID_LENGTH = 26
_MAC_LENGTH = 16


@dataclass(frozen=True)
class Handle:
    call_id: str
    choice: int


class HandleCheck(enum.StrEnum):
    """What a handle in a client's history turned out to be when read back."""

    VALID = "valid"
    FOREIGN = "foreign"
    """Not a rolltap handle at all (e.g. a real Anthropic signature): nothing to honour."""
    INVALID = "invalid"
    """Shaped like one, but forged, edited, or minted for another rollout."""


class Handles:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def mint(self, rollout_id: str, call_id: str, choice: int = 0) -> str:
        raw = call_id.encode("ascii") + bytes([choice]) + self._mac(rollout_id, call_id, choice)
        return PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")

    def read(self, token: object, rollout_id: str) -> tuple[HandleCheck, Handle | None]:
        if not isinstance(token, str) or not token.startswith(PREFIX):
            return HandleCheck.FOREIGN, None
        body = token[len(PREFIX) :]
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError):
            return HandleCheck.INVALID, None
        if len(raw) != _CALL_ID_LENGTH + 1 + _MAC_LENGTH:
            return HandleCheck.INVALID, None
        try:
            call_id = raw[:_CALL_ID_LENGTH].decode("ascii")
        except UnicodeDecodeError:
            return HandleCheck.INVALID, None
        choice = raw[_CALL_ID_LENGTH]
        if not hmac.compare_digest(raw[-_MAC_LENGTH:], self._mac(rollout_id, call_id, choice)):
            return HandleCheck.INVALID, None
        return HandleCheck.VALID, Handle(call_id, choice)

    def _mac(self, rollout_id: str, call_id: str, choice: int) -> bytes:
        message = f"{rollout_id}\0{call_id}\0{choice}".encode()
        return hmac.new(self._key, message, hashlib.sha256).digest()[:_MAC_LENGTH]
