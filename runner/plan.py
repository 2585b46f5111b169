"""Which rollouts a batch still needs, creating them (or a next attempt) in the store.

A batch is (tasks x samples). Each sample's latest attempt decides: one with a verdict is kept
(`kept`); an unfinished one (interrupted run, killed process) is marked cancelled and replaced by
a new attempt with a fresh key, and one that failed with no verdict (its sandbox, its harness
crashing, its verifier, a lost attempt) is kept as it is and gets a new attempt too, so
rerunning `rolltap run` completes a batch without duplicating or redoing judged work, and
nothing recorded is deleted. `retry_failed` reruns every sample that did not succeed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..proxy.staleness import MARK
from ..store import CreatedRollout, NewRollout, RolloutStatus, RolloutView, Store
from ..store.events import SUPERSEDED_BY, Superseded
from .harnesses.base import Ending
from .settings import BatchSettings, check_resumable
from .tasks import Task

if TYPE_CHECKING:
    # The batch spec's limits, read here; service/ imports this module, so not at run time.
    from .service.spec import Budgets

DONE = {
    RolloutStatus.SUCCEEDED,
    RolloutStatus.FAILED,
    RolloutStatus.TIMED_OUT,
    RolloutStatus.BUDGET_EXCEEDED,
}
INFRA = "infra_failure"
"""Metadata flag of an attempt that failed for reasons of the machine, not of the agent."""
RELAUNCH_OF = "relaunch_of"
"""Metadata of an attempt launched because the one before it ran too far behind the policy
(the rollout service's `stale: "relaunch"`): that attempt's id."""


@dataclass(frozen=True)
class Planned:
    task: Task
    sample_index: int
    rollout_id: str
    key: str
    attempt: int


async def plan(
    store: Store,
    batch_id: str,
    tasks: Sequence[Task],
    samples: int,
    *,
    harness: str,
    model: str | None,
    budgets: Budgets,
    meta: dict[str, Any],
    settings: BatchSettings | None = None,
    retry_failed: bool = False,
) -> tuple[list[Planned], list[RolloutView]]:
    """(rollouts to run, finished rollouts kept from an earlier run).

    `settings`: recorded on each new rollout; a batch whose rollouts ran with others is refused
    (BatchSettingsChanged) before anything is created."""
    latest = await _latest(store, batch_id, settings)
    if settings is not None:
        meta = {**meta, "settings": settings.as_meta()}
    todo: list[Planned] = []
    kept_views: list[RolloutView] = []
    for task in tasks:
        for sample in range(samples):
            previous = latest.get((task.id, sample))
            if previous is not None and kept(previous, retry_failed=retry_failed):
                kept_views.append(previous)
                continue
            attempt = 0
            if previous is not None:
                attempt = previous.attempt + 1
            created = await store.create_rollout(
                NewRollout(
                    batch_id=batch_id,
                    task_id=task.id,
                    sample_index=sample,
                    attempt=attempt,
                    harness=harness,
                    model=model,
                    max_calls=budgets.max_calls,
                    max_tokens=budgets.max_tokens,
                    meta=meta,
                )
            )
            if previous is not None and previous.status not in DONE:
                await supersede(store, previous, created.id, "interrupted")
            elif previous is not None:
                # It ended and stays as it ended; a reader follows it to the attempt after it.
                await store.update_rollout(previous.id, merge_meta={SUPERSEDED_BY: created.id})
            todo.append(Planned(task, sample, created.id, created.key, attempt))
    return todo, kept_views


async def to_run(
    store: Store,
    batch_id: str,
    tasks: Sequence[Task],
    samples: int,
    *,
    settings: BatchSettings | None = None,
    retry_failed: bool = False,
) -> int:
    """How many rollouts `plan` would start, read without writing anything: a rerun decides
    "nothing to run" or "settings differ" (BatchSettingsChanged) before it starts an engine."""
    latest = await _latest(store, batch_id, settings)
    return sum(
        1
        for task in tasks
        for sample in range(samples)
        if (previous := latest.get((task.id, sample))) is None
        or not kept(previous, retry_failed=retry_failed)
    )


async def _latest(
    store: Store, batch_id: str, settings: BatchSettings | None
) -> dict[tuple[str, int], RolloutView]:
    """Each sample's latest attempt, once the batch's rollouts are found to have run with
    `settings` (when given)."""
    latest: dict[tuple[str, int], RolloutView] = {}
    existing = await store.rollouts(batch=batch_id, oldest_first=True)
    if settings is not None:
        check_resumable(batch_id, settings, (view.meta for view in existing))
    for view in existing:
        if view.task_id is None or view.sample_index is None:
            continue
        slot = (view.task_id, view.sample_index)
        if slot not in latest or view.attempt > latest[slot].attempt:
            latest[slot] = view
    return latest


def finished(view: RolloutView) -> bool:
    """Ended by the agent or its verifier, not by the machine."""
    return view.status in DONE and not view.meta.get(INFRA)


def kept(view: RolloutView, *, retry_failed: bool = False) -> bool:
    """Kept by a rerun: it ended with a verdict on the agent. A failure with no reward (its
    sandbox would not start, its verifier failed, its attempt was lost) was never judged, and
    a harness that crashed ("failed": not a limit, not an LLM call it gave up on) judged the
    harness, not the agent, so a rerun tries both again; `retry_failed` also reruns every
    other attempt that did not finish (failed, timed out, over budget)."""
    if not finished(view):
        return False
    if view.status is RolloutStatus.FINISHED:
        return True
    if retry_failed:
        return False
    if view.status is not RolloutStatus.FAILED:
        return True
    crashed = (view.reward_details or {}).get("ending") == Ending.FAILED.value
    return view.reward is not None and not crashed


async def supersede(store: Store, old: RolloutView, new_id: str, why: str) -> None:
    """Close an attempt that will not finish; it points to the one that replaces it."""
    await store.report(old.id, Superseded(new_id, why))


async def next_attempt(store: Store, planned: Planned, why: str) -> Planned:
    """A fresh attempt (new row, new key) for a sample whose attempt the machine failed; the
    failed one is kept, marked, and points to it."""
    old = await store.rollout(planned.rollout_id)
    # What the proxy found stale was that attempt: the new one's calls are judged afresh.
    meta = {k: v for k, v in old.meta.items() if k not in (SUPERSEDED_BY, MARK)}
    created = await _new_attempt(store, old, meta)
    await store.update_rollout(old.id, merge_meta={INFRA: True})
    await supersede(store, old, created.id, f"infrastructure: {why}")
    return Planned(planned.task, planned.sample_index, created.id, created.key, old.attempt + 1)


async def relaunch(
    store: Store, planned: Planned, old: RolloutView, meta: dict[str, Any]
) -> Planned:
    """A fresh attempt of `planned`'s sample, with `meta`, after its attempt `old` was stopped
    for running too far behind the policy (proxy/staleness.py); `old` is kept, pointing to
    it."""
    created = await _new_attempt(store, old, {**meta, RELAUNCH_OF: old.id})
    await supersede(store, old, created.id, old.error or "stale")
    return Planned(planned.task, planned.sample_index, created.id, created.key, old.attempt + 1)


async def _new_attempt(store: Store, old: RolloutView, meta: dict[str, Any]) -> CreatedRollout:
    return await store.create_rollout(
        NewRollout(
            batch_id=old.batch_id,
            task_id=old.task_id,
            sample_index=old.sample_index,
            attempt=old.attempt + 1,
            harness=old.harness,
            model=old.model,
            max_calls=old.max_calls,
            max_tokens=old.max_tokens,
            meta=meta,
        )
    )
