"""What a trainer posts about a batch (`POST /v1/batches/{id}/metrics`), checked before it is
stored, and what the service records of a batch itself for the training view.

    {"policy_version": "3",
     "metrics": {"logprob_mismatch_max": 2.4e-5, "loss": 0.012,
                 "seconds": {"sample": 41.0, "wait": 0.3, "update": 2.1}}}

`policy_version` defaults to the batch's. A metric is a finite number, a short string, true or
false, or an object of finite numbers (one level: `seconds`, a phase's breakdown); `seconds` holds
each phase's duration, none negative. The names the training view knows: `logprob_mismatch_max`,
`logprob_mismatch_mean` (|trainer - engine| logprob over the sampled tokens) and `seconds`; any
other is shown as posted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from .batch import Batch
from .spec import SpecError

MAX_METRICS = 200
MAX_NAME = 100
MAX_TEXT = 500
SECONDS = "seconds"


@dataclass(frozen=True)
class Posted:
    policy_version: str | None
    metrics: dict[str, Any]


def parse_posted(body: Mapping[str, Any]) -> Posted:
    """Raises SpecError naming the field at fault."""
    unknown = sorted(set(body) - {"policy_version", "metrics"})
    if unknown:
        raise SpecError(
            f"unknown field {unknown[0]!r}: a metrics post has policy_version and metrics",
            unknown[0],
        )
    version = body.get("policy_version")
    if isinstance(version, bool) or not isinstance(version, str | int | None):
        raise SpecError("'policy_version' must be a string", "policy_version")
    metrics = body.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        raise SpecError("'metrics' must be an object of at least one metric", "metrics")
    if len(metrics) > MAX_METRICS:
        raise SpecError(f"'metrics' has more than {MAX_METRICS} metrics", "metrics")
    for name, value in metrics.items():
        _check(name, value)
    return Posted(None if version is None else str(version), dict(metrics))


def _check(name: str, value: object) -> None:
    where = f"metrics.{name}"
    if not name or len(name) > MAX_NAME:
        raise SpecError(f"a metric's name must be 1 to {MAX_NAME} characters", "metrics")
    if name == SECONDS:
        if not isinstance(value, dict) or not all(_number(v) and v >= 0 for v in value.values()):
            raise SpecError(
                "'metrics.seconds' must be an object of phase -> seconds (numbers, none "
                'negative), e.g. {"sample": 41.0, "update": 2.1}',
                where,
            )
    elif isinstance(value, dict):
        if not all(isinstance(k, str) and k and _number(v) for k, v in value.items()):
            raise SpecError(f"'{where}' must be an object of finite numbers", where)
    elif isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise SpecError(f"'{where}' is longer than {MAX_TEXT} characters", where)
    elif not (isinstance(value, bool) or _number(value)):
        raise SpecError(
            f"'{where}' must be a finite number, a string, true or false, or an object of numbers",
            where,
        )


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def service_record(batch: Batch) -> dict[str, Any]:
    """What the service knows of a batch that the store does not: its labels, how its groups
    were judged (dynamic sampling), how long it sampled."""
    summary = batch.summary()
    record: dict[str, Any] = {
        "status": summary["status"],
        "labels": dict(batch.spec.labels),
        "samples_per_task": batch.spec.samples_per_task,
        "keep": batch.spec.keep.value,
        "target_groups": batch.spec.target_groups,
        "groups": summary["groups"],
        "cancelled_rollouts": batch.cancelled_rollouts,
        "relaunched_rollouts": batch.relaunched,
        "created_at": summary["created_at"],
        "finished_at": summary["finished_at"],
    }
    if batch.finished_at is not None:
        record[SECONDS] = {"sample": (batch.finished_at - batch.created_at).total_seconds()}
    return record
