"""Sampling options a rollout's batch imposes on every engine call it makes.

A trainer decides how its policy samples (temperature, top_p, the generation limit...), not
the harness: the rollout service stores the batch's `sampling` in each rollout's metadata and
the proxy puts them into the request the engine gets, replacing what the harness sent. The
client's own request is recorded as it came; the engine request shows what was sampled with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

IMPOSABLE: dict[str, type[int] | type[float]] = {
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "max_tokens": int,
    "seed": int,
    "presence_penalty": float,
    "frequency_penalty": float,
    "repetition_penalty": float,
}
"""What a batch may impose, and each option's type."""


def rollout_sampling(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The options a rollout's metadata imposes (unknown keys ignored), or None."""
    found = meta.get("sampling")
    if not isinstance(found, dict):
        return None
    chosen = {k: v for k, v in found.items() if k in IMPOSABLE and isinstance(v, int | float)}
    return chosen or None


def impose(body: dict[str, Any], sampling: Mapping[str, Any] | None) -> dict[str, Any]:
    """The chat request with `sampling` in force (a new dict; `body` is left as it came)."""
    if not sampling:
        return body
    out = {**body, **sampling}
    if "max_tokens" in sampling and body.get("max_completion_tokens") is not None:
        out["max_completion_tokens"] = sampling["max_tokens"]
    return out
