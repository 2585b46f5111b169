"""A rollout's life, in one place: the statuses it may move between, what each thing that
happens to it (store/events.py) makes its status, and how a write is resolved against what the
store holds when the write runs.

    pending ──▶ running ──▶ finished | failed | timed_out | cancelled | budget_exceeded | expired
       └───────────────────▶ (any ending)

Writers report events (`Store.report`); `transition` alone turns an event into the write: the
status it asks for, its error and times, and the rule it is written under. An ended rollout stays
ended: its status never changes again. Every write goes through `resolve`, inside the store
writer's transaction (store/writer.py), so the check and the write see the same row, whoever
reports (the proxy, the runner, the rollout service, a Ray node, the admin API):

- a step that must not undo another (the first call's pending -> running, the proxy's budget,
  staleness and expiry endings, a batch's cancellation) applies only while the rollout is still
  open (`only_from`): after another ending it is simply not applied;
- the end of a runner's attempt (`keep_ending`) that finds the rollout already ended keeps the
  first ending (the proxy ended it for its budget, its staleness bound or an expiry) and records
  the rest: the runner's reward, details and meta of the same rollout;
- any other change of an ended rollout's status (the admin API's), or a step the diagram has no
  arrow for, raises `IllegalTransition` (the admin API answers 409).

`merge_meta` merges keys into the stored metadata in that same transaction, and `append_meta`
appends items to lists in it: no reader sees, and no concurrent writer loses, a half-merged or
overwritten dict or list (no read-modify-write elsewhere). The store's update returns the row as
the write left it, so a writer learns what others wrote first without reading it again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, overload

from .enums import RolloutStatus
from .errors import StoreError
from .events import (
    SUPERSEDED_BY,
    AttemptLost,
    BudgetExceeded,
    Cancelled,
    Declared,
    Ending,
    Event,
    HarnessEnded,
    IdleExpired,
    StaleDropped,
    StaleMarked,
    Started,
    Superseded,
)

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
CREATED = RolloutStatus.PENDING
"""The status of a new rollout."""
TIMED_OUT_ERROR = "harness killed at its timeout"


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


_STAYS_PENDING = frozenset({RolloutStatus.PENDING})


@dataclass(frozen=True)
class _Step:
    """What an event asks of a rollout: a status, the columns written with it, and the rule."""

    status: RolloutStatus | None
    columns: Mapping[str, Any] = field(default_factory=dict)
    only_from: frozenset[RolloutStatus] | None = None
    keep_ending: bool = False
    meta: Mapping[str, Any] = field(default_factory=dict)


def _step(event: Event) -> _Step:
    match event:
        case Started():
            # The first call's step must not undo an ending written before it.
            return _Step(RolloutStatus.RUNNING, only_from=_STAYS_PENDING)
        case BudgetExceeded(error=error):
            return _Step(RolloutStatus.BUDGET_EXCEEDED, {"error": error}, OPEN)
        case IdleExpired(error=error):
            return _Step(RolloutStatus.EXPIRED, {"error": error}, OPEN)
        case StaleMarked(meta=meta):
            return _Step(None, only_from=OPEN, meta=meta)
        case StaleDropped(error=error, meta=meta):
            return _Step(RolloutStatus.CANCELLED, {"error": error}, OPEN, meta=meta)
        case HarnessEnded():
            ending, why = _harness_ending(event)
            details = None if event.details is None else dict(event.details)
            columns = {"reward": event.reward, "reward_details": details, "error": why}
            return _Step(ending, columns, keep_ending=True, meta=event.meta)
        case AttemptLost(error=error, meta=meta):
            return _Step(RolloutStatus.FAILED, {"error": error}, keep_ending=True, meta=meta)
        case Cancelled(error=error):
            return _Step(RolloutStatus.CANCELLED, {"error": error}, OPEN)
        case Superseded(by=by, why=why):
            retried = {"error": f"{why}; retried as {by}"}
            return _Step(
                RolloutStatus.CANCELLED, retried, keep_ending=True, meta={SUPERSEDED_BY: by}
            )
        case Declared(status=status):
            return _Step(RolloutStatus(status))


def _harness_ending(event: HarnessEnded) -> tuple[RolloutStatus, str | None]:
    # A verifier that could not give a reward fails the attempt even when the harness ran out of
    # time.
    if event.verifier_failure is not None:
        return RolloutStatus.FAILED, event.verifier_failure
    if event.timed_out:
        return RolloutStatus.TIMED_OUT, TIMED_OUT_ERROR
    if event.failure is not None:
        return RolloutStatus.FAILED, event.failure
    return RolloutStatus.FINISHED, None


@overload
def status_of(event: Ending | Started) -> RolloutStatus: ...
@overload
def status_of(event: Event) -> RolloutStatus | None: ...
def status_of(event: Event) -> RolloutStatus | None:
    """The status `event` asks for (None: it asks for none); what the rollout gets is decided
    against its row when the write runs (`resolve`)."""
    return _step(event).status


def transition(
    event: Event, values: Mapping[str, Any], now: datetime
) -> tuple[dict[str, Any], Change]:
    """The write that reports `event`, beside the plain column `values` its reporter writes with
    it (hack flags; the admin API's reward, error, meta): the columns and the rule `resolve`
    applies to them."""
    step = _step(event)
    out: dict[str, Any] = {}
    if step.status is not None:
        out["status"] = step.status.value
    out |= step.columns
    taken = set(out) & set(values)
    if taken:
        raise TypeError(f"{type(event).__name__} writes {sorted(taken)} itself")
    times: dict[str, Any] = {}
    if step.status is RolloutStatus.RUNNING:
        times["started_at"] = now
    if step.status in ENDED:
        times["finished_at"] = now
    only_from = None if step.only_from is None else frozenset(s.value for s in step.only_from)
    return {**times, **out, **values}, Change(only_from, step.keep_ending, dict(step.meta))
