"""A rollout's life has one owner (store/lifecycle.py): an ended rollout never changes status,
an ending that finds it ended keeps the first and records the rest, a guarded step that no
longer applies is skipped, and meta merges never lose another writer's keys."""

from __future__ import annotations

import asyncio

import pytest

from rolltap.store import IllegalTransition, NewRollout, RolloutStatus, Store
from rolltap.store.events import Declared, HarnessEnded, Started
from rolltap.store.lifecycle import ENDED, NEXT, OPEN


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
