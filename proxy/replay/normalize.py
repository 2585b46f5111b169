"""What two requests of a replay are compared on: the client's body, less what varies by itself.

A harness run twice on the same task with the same answers sends the same requests except for
values no answer influences. Found by replaying real mini-swe-agent, Codex and Claude Code
sessions (tests/runner/test_replay*.py); each rule names where it comes from. Version `v1`:

- strings are rewritten (every string in the body, keys excepted), in this order:
  - the batch names of the original and the replay (in the local sandbox's paths) -> `<batch>`;
  - `rt1.…` handles rolltap signs into thinking signatures and Responses `encrypted_content`
    (they name the call that minted them) -> `<handle>`;
  - 26-character ULIDs -> `<id>`: the ids rolltap mints from its call ids and hands the client
    (`resp_…`, `msg_…`, `rs_…`, `fc_…`, `toolu_…`, `call_…`), and rollout ids in paths;
  - rollout keys (`rk-…`) -> `<key>`;
  - Claude Code's `x-anthropic-billing-header: …` system line (its `cch=` hash changes per
    request) -> `x-anthropic-billing-header: <volatile>`;
  - the header Codex writes over each command's output: a `Chunk ID: <hex>` line (random) and
    a `Wall time: <seconds> seconds` line -> `<volatile>`;
- `id` fields holding a string are blanked to `<volatile>` wherever they appear: Codex mints a
  UUID for every input item it sends back, and ids are identities, never what a model reads
  (the references to them, `call_id`, `tool_call_id`, `tool_use_id`, stay compared);
- fields are blanked to `<volatile>` wherever they appear: `metadata` (Claude Code's
  `user_id` carries a per-run session id), `prompt_cache_key` and `client_metadata` (Codex's
  session, thread and turn ids);
- `cache_control` markers are dropped: they tell a server what to cache, never what the model
  reads.

Headers are not compared (they are not recorded): `x-stainless-*` retry counts and timeouts,
session headers and user agents never count. Everything else must be equal, so a tool output
that differs (a random number, the time) shows as a divergence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

VERSION = "v1"
VOLATILE = "<volatile>"
_BLANKED = frozenset({"metadata", "prompt_cache_key", "client_metadata"})
_DROPPED = frozenset({"cache_control"})
_REWRITES = (
    (re.compile(r"rt1\.[A-Za-z0-9_-]+=*"), "<handle>"),
    (re.compile(r"(?<![0-9A-Za-z])[0-9A-HJKMNP-TV-Z]{26}(?![0-9A-Za-z])"), "<id>"),
    (re.compile(r"rk-[A-Za-z0-9_-]{32}"), "<key>"),
    (re.compile(r"x-anthropic-billing-header:[^\n]*"), f"x-anthropic-billing-header: {VOLATILE}"),
    (re.compile(r"^Chunk ID: [0-9a-f]+$", re.M), f"Chunk ID: {VOLATILE}"),
    (re.compile(r"^Wall time: [0-9.]+ seconds$", re.M), f"Wall time: {VOLATILE} seconds"),
)


class Normalizer:
    """`batches`: the batch names of the original and the replay, rewritten to `<batch>`."""

    def __init__(self, batches: Iterable[str | None] = ()) -> None:
        names = sorted({b for b in batches if b}, key=len, reverse=True)
        self._batches = re.compile("|".join(map(re.escape, names))) if names else None

    def body(self, value: Any) -> Any:
        """A JSON value (a parsed request body) with the volatile parts rewritten."""
        if isinstance(value, dict):
            return {
                k: VOLATILE if k in _BLANKED or (k == "id" and isinstance(v, str)) else self.body(v)
                for k, v in value.items()
                if k not in _DROPPED
            }
        if isinstance(value, list):
            return [self.body(v) for v in value]
        if isinstance(value, str):
            return self.text(value)
        return value

    def text(self, value: str) -> str:
        if self._batches is not None:
            value = self._batches.sub("<batch>", value)
        for pattern, replacement in _REWRITES:
            value = pattern.sub(replacement, value)
        return value
