"""The hash chain over a rollout's calls: each record's digest, and the link to the one before.

Every call row carries two SHA-256 values, as 64 lowercase hex characters:

    digest = SHA-256(b"rolltap.call.v1\\n" || E(field_1) || E(field_2) || ...)
    hash   = SHA-256(b"rolltap.link.v1\\n" || prev || digest)

`prev` is the 32 raw bytes of the `hash` of the same rollout's call with the next lower `seq`, or
32 zero bytes (`GENESIS`) for its first call (and after a call stored without a hash, by a
rolltap older than the chain). `digest` and `prev` enter the link as raw bytes, not hex. A
rollout's head is the `hash` of its highest-seq call when it ended (`rollout.head_hash`, with
that call's `rollout.head_seq`; `GENESIS` and 0 for a rollout that ended without calls).

The digest says whether a record was altered, on its own; the links say whether one is missing
or out of place. `seq` itself is not in the digest: the chain is the order.

**Hack flags.** A rollout the reward-hack detectors flagged (`rollout.hack_flags`, a non-empty
list; analysis/hacks.py) seals them too, as one more link after its last call:

    head = SHA-256(b"rolltap.link.v1\n" || end || SHA-256(b"rolltap.flags.v1\n" || C(flags)))

where `end` is the raw hash the head would otherwise be (its last call's, or `GENESIS`) and
`C(flags)` the canonical JSON text below of the stored list. A rollout without flags (none
raised, or never checked) seals `end` itself, as before flags existed, so a flag removed or
added afterwards breaks the head as a call would.

**Field encoding** `E(v)`, by the value's type (lengths and integers big-endian):

| value | bytes |
|---|---|
| None | `N` |
| bool | `T` or `F` |
| int | `I` + 8-byte two's complement |
| datetime | `I` + microseconds since 1970-01-01T00:00:00Z (UTC) as above |
| str | `S` + 8-byte byte length + UTF-8 |
| bytes | `B` + 8-byte length + the bytes |
| JSON object (`usage`) | `S` of its canonical text (below) |

Canonical JSON text: Python's `json.dumps(v, sort_keys=True, separators=(",", ":"),
ensure_ascii=False)`: keys sorted, no whitespace, non-ASCII characters kept as UTF-8.

**Fields, in order** (the names of the `call`, `choice` and `call_body` columns):

1. `id`, `rollout_id`, `dialect`, `purpose`, `model`, `backend`, `status`, `http_status`,
   `error`, `stream`, `capture`, `received_at`, `dispatched_at`, `first_token_at`,
   `finished_at`, `weight_version`, `finish_reason`, `usage`, `retry_count`, `body_hash`,
   `retry_of`, `prompt_tokens`, `completion_tokens`, `n_choices`, `resumes`, `bridge`,
   `tool_parse` only when it is not None (records from before it keep their digests), and
   `weight_spans` only when it is not None, after the bytes `weight_spans` (which versions
   sampled which tokens of an answer across an in_place update: the record of which weights
   served it is sealed with it), and `weights_digest` likewise, after the bytes
   `weights_digest` (the digest of the engines' checksums of the weights its version was
   served with, `checksums_digest`);
2. the full prompt token ids as bytes (int32 little-endian, `b""` when the call has none): the
   prompt as sent, not its stored delta (`prompt_parent_id`, `prompt_shared`, `prompt_suffix`
   are a storage encoding and are covered through the rebuilt prompt);
3. for each choice row in `idx` order: `idx`, `finish_reason`, `n_tokens`, `token_ids` (bytes,
   int32 LE, exactly as stored), `logprobs` (bytes, float32 LE, or None);
4. for `request`, `engine_request`, `response`: the 32-byte SHA-256 of the uncompressed body as
   bytes, or None when there is none (no `call_body` row: all three None).
"""

from __future__ import annotations

import hashlib
import json
import numbers
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

GENESIS = bytes(32)
"""The `prev` of a rollout's first call."""
GENESIS_HEX = GENESIS.hex()

CALL_FIELDS = (
    "id",
    "rollout_id",
    "dialect",
    "purpose",
    "model",
    "backend",
    "status",
    "http_status",
    "error",
    "stream",
    "capture",
    "received_at",
    "dispatched_at",
    "first_token_at",
    "finished_at",
    "weight_version",
    "finish_reason",
    "usage",
    "retry_count",
    "body_hash",
    "retry_of",
    "prompt_tokens",
    "completion_tokens",
    "n_choices",
    "resumes",
    "bridge",
)
CHOICE_FIELDS = ("idx", "finish_reason", "n_tokens", "token_ids", "logprobs")

_CALL_TAG = b"rolltap.call.v1\n"
_WEIGHT_SPANS = b"weight_spans"
_WEIGHTS_DIGEST = b"weights_digest"
_LINK_TAG = b"rolltap.link.v1\n"
_FLAGS_TAG = b"rolltap.flags.v1\n"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def encode(value: Any) -> bytes:
    """E(value): one field in the canonical encoding."""
    # Most frequent types first: this runs some thirty times per call on the writer's path.
    if value is None:
        return b"N"
    if isinstance(value, str):
        data = value.encode()
        return b"S" + len(data).to_bytes(8, "big") + data
    if isinstance(value, bytes):
        return b"B" + len(value).to_bytes(8, "big") + value
    if isinstance(value, bool):
        return b"T" if value else b"F"
    if isinstance(value, int):
        return b"I" + value.to_bytes(8, "big", signed=True)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime in a call record; the store keeps aware UTC ones")
        return encode((value - _EPOCH) // _MICROSECOND)
    if isinstance(value, dict):
        return encode(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
    if isinstance(value, bytearray | memoryview):
        return encode(bytes(value))
    if isinstance(value, numbers.Integral):
        return encode(int(value))
    raise TypeError(f"no canonical encoding for {type(value).__name__}")


def checksums_digest(checksums: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of per-parameter weight checksums (name -> checksum), as canonical JSON."""
    canonical = json.dumps(checksums, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def body_digest(body: bytes | None) -> bytes | None:
    return None if body is None else hashlib.sha256(body).digest()


def call_digest(
    call: Mapping[str, Any],
    prompt: bytes,
    choices: Iterable[Mapping[str, Any]],
    bodies: Sequence[bytes | None],
) -> bytes:
    """The digest of one call record; `bodies` are the three `body_digest`s."""
    parts = [_CALL_TAG]
    parts.extend(encode(call[name]) for name in CALL_FIELDS)
    if call.get("tool_parse") is not None:
        parts.append(encode(call["tool_parse"]))
    if call.get("weight_spans") is not None:
        parts.append(_WEIGHT_SPANS + encode(call["weight_spans"]))
    if call.get("weights_digest") is not None:
        parts.append(_WEIGHTS_DIGEST + encode(call["weights_digest"]))
    parts.append(encode(prompt))
    for choice in sorted(choices, key=lambda c: int(c["idx"])):
        parts.extend(encode(choice[name]) for name in CHOICE_FIELDS)
    parts.extend(encode(digest) for digest in bodies)
    # One update of the joined parts: cheaper than forty small ones.
    return hashlib.sha256(b"".join(parts)).digest()


def link(prev: bytes, digest: bytes) -> bytes:
    """The call's `hash`: its digest chained to the hash of the call before it."""
    return hashlib.sha256(_LINK_TAG + prev + digest).digest()


def sealed_head(end: str, flags: Sequence[Mapping[str, Any]] | None) -> str:
    """The head a rollout seals: `end` (hex, its chain's end) with its hack flags linked on
    when there are any."""
    if not flags:
        return end
    text = json.dumps(list(flags), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(_FLAGS_TAG + text.encode()).digest()
    return link(prev_of(end), digest).hex()


def prev_of(stored_hash: str | None) -> bytes:
    """The `prev` a call following one with this stored hash is chained to: GENESIS after a call
    without a usable hash (recorded before the chain existed, or overwritten with junk, which
    must not stop the rollout from recording)."""
    if stored_hash is None or not is_hex_digest(stored_hash):
        return GENESIS
    return bytes.fromhex(stored_hash)


def is_hex_digest(text: str | None) -> bool:
    """A SHA-256 as the store keeps it: 64 lowercase hex characters."""
    return text is not None and len(text) == 64 and all(c in "0123456789abcdef" for c in text)
