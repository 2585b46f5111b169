"""The figures a trainer posted about a run's batches, as the training view merges and shows
them: posts about the same version in posting order (a later value replaces an earlier one,
phase by phase for `seconds`); over several batches of one version, phases add up, a `*_max`
is the largest and other numbers are averaged."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MISMATCH_MAX = "logprob_mismatch_max"
MISMATCH_MEAN = "logprob_mismatch_mean"
SECONDS = "seconds"


def merge_posts(posts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One batch's posts about one version, oldest first, as one."""
    merged: dict[str, Any] = {}
    for metrics in posts:
        for name, value in metrics.items():
            if name == SECONDS and isinstance(merged.get(name), dict):
                merged[name] = {**merged[name], **value}
            else:
                merged[name] = value
    return merged


def combine(per_batch: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The merged posts of the batches of one version, as one."""
    if len(per_batch) == 1:
        return per_batch[0]
    combined: dict[str, Any] = {}
    for name in {n for m in per_batch for n in m}:
        values = [m[name] for m in per_batch if name in m]
        numbers = [v for v in values if number(v) is not None]
        if name == SECONDS:
            phases: dict[str, float] = defaultdict(float)
            for v in values:
                for phase, s in v.items():
                    phases[phase] += float(s)
            combined[name] = dict(phases)
        elif numbers and len(numbers) == len(values):
            combined[name] = max(numbers) if name.endswith("_max") else sum(numbers) / len(numbers)
        else:
            combined[name] = values[-1]
    return combined


def shown(value: object) -> str:
    """A posted figure as the page shows it: numbers to 4 significant digits."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {shown(v)}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:.4g}"
    return value if isinstance(value, str) else json.dumps(value)


def number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
