"""Routed experts (R3) in the store, on SQLite and PostgreSQL: read back byte for byte as
written, a conversation's repeated prefix stored once, and the trajectory's rows aligned with
its tokens."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from sqlalchemy import func, select

from rolltap.analysis.reading import rollout_trajectories
from rolltap.store import NewRollout, RolloutStatus, Store
from rolltap.store.events import Declared
from rolltap.store.models import routed_experts_table
from tests.support.records import call
from tests.support.stores import opened_store

LAYERS, TOPK = 4, 2


def _routing(ids: list[int], salt: int = 0) -> npt.NDArray[np.uint8]:
    """Rows that depend on the token and its position only (a cached prefix routes the same)."""
    token = np.asarray(ids[:-1])[:, None, None]
    position = np.arange(len(ids) - 1)[:, None, None]
    layer = np.arange(LAYERS)[None, :, None]
    slot = np.arange(TOPK)[None, None, :]
    return ((token * 3 + position * 5 + layer * 7 + slot + salt) % 128).astype(np.uint8)


async def _stored_bytes(store: Store, rollout_id: str) -> int:
    async with store.db.connect() as conn:
        total = await conn.scalar(
            select(func.sum(func.length(routed_experts_table.c.data))).where(
                routed_experts_table.c.rollout_id == rollout_id
            )
        )
    return int(total or 0)


async def test_a_conversation_stores_its_prefix_once_and_reads_back_exactly(
    store: Store,
) -> None:
    rollout = await store.create_rollout(NewRollout(task_id="t"))
    prompt = list(range(10, 60))
    written = []
    for turn in range(4):
        answer = [200 + turn] * 5
        ids = [*prompt, *answer]
        routing = _routing(ids)
        record = call(rollout.id, prompt, answer, routed_experts={0: routing})
        record.routed_source = "vllm"
        receipt = await store.append_call(record)
        written.append((receipt.call_id, routing))
        prompt = [*ids, 7, 8, 9]  # the observation: the next prompt extends this sequence

    read = await store.routed_experts(rollout.id)
    assert {key: value.tobytes() for key, value in read.items()} == {
        (call_id, 0): routing.tobytes() for call_id, routing in written
    }
    assert all(value.dtype == np.uint8 for value in read.values())
    whole = sum(routing.nbytes for _, routing in written)
    last = written[-1][1].nbytes
    # Each call stores only the rows after what its predecessor already holds.
    assert await _stored_bytes(store, rollout.id) == last
    assert last < whole / 2

    await store.report(rollout.id, Declared(RolloutStatus.SUCCEEDED), reward=1.0)
    (t,) = (await rollout_trajectories(store, rollout.id)).trajectories
    ids = [*t.prompt_ids.tolist(), *t.response_ids.tolist()]
    assert t.routed_experts is not None
    assert t.routed_experts.shape == (len(ids) - 1, LAYERS, TOPK)
    assert np.array_equal(t.routed_experts, _routing(ids))


async def test_rows_that_differ_are_stored_again(store: Store, db_url: str) -> None:
    """An engine that routed the shared prefix differently (recomputed, not cached): every row
    from the first difference on is stored; a cold writer (a new process) stores all."""
    rollout = await store.create_rollout(NewRollout(task_id="t"))
    first_ids = list(range(1, 41))
    first = _routing(first_ids)
    record = call(rollout.id, first_ids[:30], first_ids[30:], routed_experts={0: first})
    await store.append_call(record)
    second_ids = [*first_ids, 5, 6, 7, 8]
    second = _routing(second_ids)
    second[20:] = _routing(second_ids, salt=1)[20:]
    record = call(rollout.id, second_ids[:42], second_ids[42:], routed_experts={0: second})
    await store.append_call(record)
    row = first.nbytes // len(first)
    assert await _stored_bytes(store, rollout.id) == first.nbytes + (len(second) - 20) * row

    async with opened_store(db_url) as cold:
        third_ids = [*second_ids, 1, 2]
        third = _routing(third_ids).astype(np.uint16) + 300  # ids past 255: another dtype
        record = call(rollout.id, third_ids[:-1], third_ids[-1:], routed_experts={0: third})
        await cold.append_call(record)
    assert await _stored_bytes(store, rollout.id) == (
        first.nbytes + (len(second) - 20) * row + third.nbytes
    )
    read = await store.routed_experts(rollout.id)
    assert sorted(v.tobytes() for v in read.values()) == sorted(
        a.tobytes() for a in (first, second, third)
    )


async def test_a_trajectory_without_its_last_calls_routing_has_none(store: Store) -> None:
    """No rows are made up: the last call (a vLLM stream, say) sent none, so the trajectory,
    whose every token that call saw, carries none either."""
    rollout = await store.create_rollout(NewRollout(task_id="t"))
    ids = list(range(1, 21))
    await store.append_call(call(rollout.id, ids[:15], ids[15:], routed_experts={0: _routing(ids)}))
    await store.append_call(call(rollout.id, [*ids, 3, 4], [9, 9]))
    await store.report(rollout.id, Declared(RolloutStatus.SUCCEEDED))
    (t,) = (await rollout_trajectories(store, rollout.id)).trajectories
    assert len(t.call_ids) == 2
    assert t.routed_experts is None
