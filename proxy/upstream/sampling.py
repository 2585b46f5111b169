"""Sampling options a rollout's batch imposes on every engine call it makes, and the per-call
seed and prefix-cache salt the proxy gives each call.

A trainer decides how its policy samples (temperature, top_p, the generation limit...), not
the harness: the rollout service stores the batch's `sampling` in each rollout's metadata and
the proxy puts them into the request the engine gets, replacing what the harness sent. The
client's own request is recorded as it came; the engine request shows what was sampled with.

Seeds. A batch `seed` is never sent as it is: every sample of a GRPO group would then draw the
same tokens on a deterministic engine (a zero-variance group; AReaL #1625). Each call gets

    derived_seed = first 31 bits of BLAKE2b-64("rolltap-seed-1" | batch seed | task id |
                                                 sample index | place | attempt)

(fields joined by the unit separator 0x1f, integers in decimal, a missing task as ""), where
`place` is the number of engine calls the rollout dispatched before this one and `attempt` the
rollout's attempt number (an infrastructure retry draws afresh). A rerun of the same batch
reproduces each sample's draws; two samples, two calls or two attempts differ. The engine
request records the seed used. A seed the harness sends is left alone unless the batch imposes
one. A replay that goes live derives from the original rollout's identity (`seed_from` in its
metadata), so call N of the replay gets the seed call N of the original had.

Salts. Each call to a vLLM-dialect engine carries `cache_salt` = "rolltap-w:" + the weight
version it is dispatched under (a client's own salt is kept in front of it): an engine reuses
prefix-cache entries only within one salt, so no call reads K/V computed by older weights, while
a rollout's calls under one version still share their prefixes. Engines without salts are
flushed at each commit instead (proxy/control/weights.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
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

SEED_SCHEME = "rolltap-seed-1"
"""Names the derivation below; a different one would get another name."""

SEED_FROM = "seed_from"
"""Meta key: the identity another rollout's seeds derive from (a replay's original)."""

SALT_PREFIX = "rolltap-w:"


@dataclass(frozen=True)
class SeedSource:
    """What a rollout's per-call seeds derive from: the batch seed and the sample's identity."""

    batch_seed: int
    task: str
    sample: int
    attempt: int

    def seed(self, place: int) -> int:
        """The seed of the rollout's call at `place` (0 for its first engine call)."""
        return derived_seed(self.batch_seed, self.task, self.sample, place, self.attempt)


def derived_seed(batch_seed: int, task: str, sample: int, place: int, attempt: int) -> int:
    """The documented derivation (module docstring): a non-negative 31-bit integer, which every
    engine's seed field takes."""
    fields = (SEED_SCHEME, str(batch_seed), task, str(sample), str(place), str(attempt))
    digest = hashlib.blake2b("\x1f".join(fields).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 33


@dataclass(frozen=True)
class Sampling:
    """What a rollout's batch imposes: fixed options, and where its seeds come from."""

    options: dict[str, Any]
    """Imposed as they are (no `seed`)."""
    seeds: SeedSource | None = None

    def for_call(self, place: int) -> dict[str, Any]:
        """The options of the rollout's call at `place`."""
        if self.seeds is None:
            return self.options
        return {**self.options, "seed": self.seeds.seed(place)}


def rollout_sampling(
    meta: Mapping[str, Any], task: str | None, sample: int | None, attempt: int
) -> Sampling | None:
    """What the rollout's metadata imposes (unknown keys ignored), or None. `task`, `sample`
    and `attempt` are the rollout's own; a replay's `seed_from` names its original's."""
    found = meta.get("sampling")
    if not isinstance(found, dict):
        return None
    chosen = {
        k: v
        for k, v in found.items()
        if k in IMPOSABLE and isinstance(v, int | float) and not isinstance(v, bool)
    }
    batch_seed = chosen.pop("seed", None)
    if batch_seed is None:
        return Sampling(chosen) if chosen else None
    origin = meta.get(SEED_FROM)
    if isinstance(origin, dict):
        task, sample, attempt = _identity(origin)
    source = SeedSource(int(batch_seed), task or "", sample or 0, attempt)
    return Sampling(chosen, source)


def _identity(origin: dict[str, Any]) -> tuple[str | None, int | None, int]:
    """(task, sample, attempt) as a replay's `seed_from` names them."""
    task, sample, attempt = origin.get("task"), origin.get("sample"), origin.get("attempt")
    return (
        task if isinstance(task, str) else None,
        sample if isinstance(sample, int) else None,
        attempt if isinstance(attempt, int) else 0,
    )


def impose(body: dict[str, Any], sampling: Mapping[str, Any] | None) -> dict[str, Any]:
    """The chat request with `sampling` in force (a new dict; `body` is left as it came)."""
    if not sampling:
        return body
    out = {**body, **sampling}
    if "max_tokens" in sampling and body.get("max_completion_tokens") is not None:
        out["max_completion_tokens"] = sampling["max_tokens"]
    return out


def cache_salt(weight_version: str | None, own: object = None) -> str:
    """The prefix-cache salt of a call dispatched under `weight_version`; `own`: the salt the
    client sent, kept in front so its isolation holds too."""
    salt = SALT_PREFIX + ("" if weight_version is None else weight_version)
    return f"{own}|{salt}" if isinstance(own, str) and own else salt
