"""A rollout's life has one owner (store/lifecycle.py): an ended rollout never changes status,
an ending that finds it ended keeps the first and records the rest, a guarded step that no
longer applies is skipped, and meta merges never lose another writer's keys."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from rolltap.store import IllegalTransition, NewRollout, RolloutStatus, Store
from rolltap.store.events import (
    AttemptLost,
    BudgetExceeded,
    Cancelled,
    Declared,
    Event,
    HarnessEnded,
    IdleExpired,
    StaleDropped,
    StaleMarked,
    Started,
    Superseded,
)
from rolltap.store.lifecycle import ENDED, NEXT, OPEN, status_of, transition


async def test_an_ended_rollout_never_changes_status(store: Store) -> None:
    rid = (await store.create_rollout(NewRollout())).id
    await store.report(rid, Declared(RolloutStatus.RUNNING))
    await store.report(rid, Declared(RolloutStatus.BUDGET_EXCEEDED), error="budget")

    with pytest.raises(IllegalTransition, match="is budget_exceeded: it cannot become finished"):
        await store.report(rid, Declared(RolloutStatus.FINISHED), reward=1.0)
    with pytest.raises(IllegalTransition, match="cannot become running"):
        await store.report(rid, Declared(RolloutStatus.RUNNING))

    view = await store.rollout(rid)
    assert (view.status, view.reward, view.error) == (RolloutStatus.BUDGET_EXCEEDED, None, "budget")


async def test_running_never_goes_back_to_pending(store: Store) -> None:
    rid = (await store.create_rollout(NewRollout())).id
    await store.report(rid, Declared(RolloutStatus.RUNNING))
    with pytest.raises(IllegalTransition):
        await store.report(rid, Declared(RolloutStatus.PENDING))


async def test_the_runner_s_ending_keeps_the_proxy_s_and_records_the_reward(store: Store) -> None:
    rid = (await store.create_rollout(NewRollout())).id
    await store.report(rid, Declared(RolloutStatus.BUDGET_EXCEEDED), error="its budget")
    first = (await store.rollout(rid)).finished_at

    await store.report(rid, HarnessEnded(0.5, meta={"logs_dir": "/logs"}))

    view = await store.rollout(rid)
    assert (view.status, view.error, view.reward) == (
        RolloutStatus.BUDGET_EXCEEDED,
        "its budget",
        0.5,
    )
    assert view.finished_at == first
    assert view.meta["logs_dir"] == "/logs"


async def test_a_guarded_step_that_no_longer_applies_is_skipped(store: Store) -> None:
    rid = (await store.create_rollout(NewRollout())).id
    await store.report(rid, Declared(RolloutStatus.CANCELLED), error="cancelled first")
    await store.report(rid, Started())
    assert (await store.rollout(rid)).status is RolloutStatus.CANCELLED


async def test_concurrent_meta_merges_keep_every_key(store: Store) -> None:
    rid = (await store.create_rollout(NewRollout(meta={"sandbox": "bwrap"}))).id
    await asyncio.gather(*(store.update_rollout(rid, merge_meta={f"k{i}": i}) for i in range(20)))
    meta = (await store.rollout(rid)).meta
    assert meta == {"sandbox": "bwrap", **{f"k{i}": i for i in range(20)}}


async def test_concurrent_list_appends_keep_every_item(store: Store) -> None:
    rid = (await store.create_rollout(NewRollout(meta={"replays": ["r0"]}))).id
    await asyncio.gather(
        *(store.update_rollout(rid, append_meta={"replays": [f"r{i}"]}) for i in range(1, 21))
    )
    replays = (await store.rollout(rid)).meta["replays"]
    assert sorted(replays) == sorted(f"r{i}" for i in range(21))


async def test_an_update_returns_the_row_as_the_write_left_it(store: Store) -> None:
    rid = (await store.create_rollout(NewRollout())).id
    await store.report(rid, Declared(RolloutStatus.BUDGET_EXCEEDED), error="its budget")

    view = await store.report(rid, HarnessEnded(1.0, meta={"a": 1}))

    assert (view.status, view.error, view.reward, view.meta) == (
        RolloutStatus.BUDGET_EXCEEDED,
        "its budget",
        1.0,
        {"a": 1},
    )
    skipped = await store.report(rid, Started())
    assert skipped == await store.rollout(rid)


def test_the_diagram() -> None:
    assert set(NEXT) == OPEN | ENDED
    assert NEXT[RolloutStatus.PENDING] == ENDED | {RolloutStatus.RUNNING}
    assert NEXT[RolloutStatus.RUNNING] == ENDED
    assert all(not NEXT[s] for s in ENDED)


NOW = datetime(2026, 11, 29, tzinfo=UTC)
_OPEN = frozenset({"pending", "running"})


@pytest.mark.parametrize(
    ("event", "values", "only_from", "keep_ending", "meta"),
    [
        (Started(), {"status": "running", "started_at": NOW}, frozenset({"pending"}), False, {}),
        (
            BudgetExceeded("spent"),
            {"status": "budget_exceeded", "error": "spent", "finished_at": NOW},
            _OPEN,
            False,
            {},
        ),
        (
            IdleExpired("idle"),
            {"status": "expired", "error": "idle", "finished_at": NOW},
            _OPEN,
            False,
            {},
        ),
        (StaleMarked({"stale": {"gap": 3}}), {}, _OPEN, False, {"stale": {"gap": 3}}),
        (
            StaleDropped("stale", {"stale": {"gap": 3}}),
            {"status": "cancelled", "error": "stale", "finished_at": NOW},
            _OPEN,
            False,
            {"stale": {"gap": 3}},
        ),
        (
            Cancelled("interrupted"),
            {"status": "cancelled", "error": "interrupted", "finished_at": NOW},
            _OPEN,
            False,
            {},
        ),
        (
            Superseded("r2", "interrupted"),
            {"status": "cancelled", "error": "interrupted; retried as r2", "finished_at": NOW},
            None,
            True,
            {"superseded_by": "r2"},
        ),
        (
            AttemptLost("infrastructure: node lost", {"infra_failure": True}),
            {"status": "failed", "error": "infrastructure: node lost", "finished_at": NOW},
            None,
            True,
            {"infra_failure": True},
        ),
        (
            Declared(RolloutStatus.FINISHED),
            {"status": "finished", "finished_at": NOW},
            None,
            False,
            {},
        ),
        (
            Declared(RolloutStatus.RUNNING),
            {"status": "running", "started_at": NOW},
            None,
            False,
            {},
        ),
    ],
)
def test_each_event_is_the_write_its_reporter_made(
    event: Event,
    values: dict[str, Any],
    only_from: frozenset[str] | None,
    keep_ending: bool,
    meta: dict[str, Any],
) -> None:
    written, change = transition(event, {}, NOW)
    assert written == values
    assert (change.only_from, change.keep_ending, change.merge_meta) == (
        only_from,
        keep_ending,
        meta,
    )


@pytest.mark.parametrize(
    ("ended", "status", "error"),
    [
        (HarnessEnded(1.0, {"ending": "finished"}), "finished", None),
        (HarnessEnded(0.0, timed_out=True), "timed_out", "harness killed at its timeout"),
        (HarnessEnded(failure="harness crashed: boom"), "failed", "harness crashed: boom"),
        (
            HarnessEnded(timed_out=True, failure="harness crashed: boom"),
            "timed_out",
            "harness killed at its timeout",
        ),
        (
            HarnessEnded(timed_out=True, verifier_failure="verifier: no output"),
            "failed",
            "verifier: no output",
        ),
    ],
)
def test_the_runner_s_ending_follows_its_harness_and_verifier(
    ended: HarnessEnded, status: str, error: str | None
) -> None:
    written, change = transition(ended, {"hack_flags": []}, NOW)
    assert (written["status"], written["error"]) == (status, error)
    assert written["reward"] == ended.reward
    assert written["hack_flags"] == []
    assert (change.only_from, change.keep_ending) == (None, True)
    assert status_of(ended).value == status


def test_a_column_the_event_writes_is_not_written_beside_it() -> None:
    with pytest.raises(TypeError, match="writes \\['error'\\] itself"):
        transition(Cancelled("stopped"), {"error": "other"}, NOW)
