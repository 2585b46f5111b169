"""A rollout's life, in one place: the statuses it may move between, and how a write to it is
resolved against what the store holds when the write runs.

    pending ──▶ running ──▶ finished | failed | timed_out | cancelled | budget_exceeded | expired
       └───────────────────▶ (any ending)

An ended rollout stays ended: its status never changes again. Every status write goes through
`resolve`, inside the store writer's transaction (store/writer.py), so the check and the write see
the same row, whoever asks (the proxy, the runner, the rollout service, a Ray node, the admin API):

- a write with `only_from` applies only while the rollout has one of those statuses (pending ->
  running after the rollout already ended is simply not applied);
- an ending with `keep_ending` that finds the rollout already ended keeps the first ending (the
  proxy ended it for its budget, its staleness bound or an expiry) and records the rest: the
  runner's reward, details and meta of the same rollout;
- any other change of an ended rollout's status, or a step the diagram has no arrow for, raises
  `IllegalTransition` (the admin API answers 409).

`merge_meta` merges keys into the stored metadata in that same transaction, and `append_meta`
appends items to lists in it: no reader sees, and no concurrent writer loses, a half-merged or
overwritten dict or list (no read-modify-write elsewhere). The store's update returns the row as
the write left it, so a writer learns what others wrote first without reading it again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .enums import RolloutStatus
from .errors import StoreError

OPEN = frozenset({RolloutStatus.PENDING, RolloutStatus.RUNNING})
ENDED = frozenset(
    {
        RolloutStatus.FINISHED,
        RolloutStatus.FAILED,
        RolloutStatus.TIMED_OUT,
        RolloutStatus.CANCELLED,
        RolloutStatus.BUDGET_EXCEEDED,
        RolloutStatus.EXPIRED,
    }
)
NEXT: Mapping[RolloutStatus, frozenset[RolloutStatus]] = {
    RolloutStatus.PENDING: frozenset({RolloutStatus.RUNNING}) | ENDED,
    RolloutStatus.RUNNING: ENDED,
    **{ended: frozenset() for ended in ENDED},
}
"""The statuses each status may move to (staying where it is is always allowed)."""


class IllegalTransition(StoreError):
    """A write asked a rollout to move where its life does not go (an ended one to another
    ending, running back to pending)."""


@dataclass(frozen=True)
class Change:
    """What one write asks of a rollout, beside its plain column values."""

    only_from: frozenset[str] | None = None
    """Apply only while the rollout has one of these statuses (values), else do nothing."""
    keep_ending: bool = False
    """An ending that finds the rollout already ended keeps the first one (and its error)."""
    merge_meta: Mapping[str, Any] = field(default_factory=dict)
    """Keys merged into the stored metadata."""
    append_meta: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    """Items appended to lists in the stored metadata (a missing key starts an empty list)."""


def resolve(
    rollout_id: str,
    status: str,
    meta: Mapping[str, Any],
    values: Mapping[str, Any],
    change: Change,
) -> dict[str, Any] | None:
    """The column values to write to a rollout now at `status` with `meta`, or None to write
    nothing. Raises IllegalTransition."""
    if change.only_from is not None and status not in change.only_from:
        return None
    out = dict(values)
    asked = out.get("status")
    if asked is not None and asked != status:
        current, wanted = RolloutStatus(status), RolloutStatus(asked)
        if change.keep_ending and current in ENDED and wanted in ENDED:
            for kept in ("status", "error", "finished_at"):
                out.pop(kept, None)
        elif wanted not in NEXT[current]:
            raise IllegalTransition(
                f"rollout {rollout_id} is {current.value}: it cannot become {wanted.value}"
            )
    if change.merge_meta or change.append_meta:
        merged = {**out.pop("meta", meta), **change.merge_meta}
        for key, items in change.append_meta.items():
            merged[key] = [*(merged.get(key) or ()), *items]
        out["meta"] = merged
    return out
