"""Prompts are stored as deltas against earlier sequences and rebuilt exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from rolltap.store import Store
from rolltap.store.delta import KnownCall, choose_parent, common_prefix
from rolltap.store.models import call_table
from tests.support.records import call
from tests.support.stores import opened_store


async def _suffix_lengths(store: Store, rollout_id: str) -> list[tuple[int, int | None, int]]:
    """(prompt_shared, parent_choice, stored suffix length) per call, in seq order."""
    c = call_table
    async with store.db.connect() as conn:
        rows = await conn.execute(
            select(c.c.prompt_shared, c.c.prompt_parent_choice, c.c.prompt_suffix)
            .where(c.c.rollout_id == rollout_id)
            .order_by(c.c.seq)
        )
        return [(s, ch, len(blob or b"") // 4) for s, ch, blob in rows]


async def test_fifty_turn_rollout_stores_each_token_once(store: Store) -> None:
    rng = np.random.default_rng(1)
    rollout = await store.create_rollout()
    prompt = rng.integers(0, 50_000, 300)
    expected = []
    for _ in range(50):
        completion = rng.integers(0, 50_000, 40)
        await store.append_call(call(rollout.id, prompt, completion))
        expected.append((prompt.copy(), completion))
        tool_output = rng.integers(0, 50_000, 20)
        prompt = np.concatenate([prompt, completion, tool_output])

    tokens = list((await store.rollout_tokens(rollout.id)).values())
    for got, (prompt_ids, completion) in zip(tokens, expected, strict=True):
        np.testing.assert_array_equal(got.prompt_ids, prompt_ids)
        np.testing.assert_array_equal(got.choices[0].token_ids, completion)
    stored = await _suffix_lengths(store, rollout.id)
    assert stored[0] == (0, None, 300)
    assert all(s == (len(expected[i][0]) - 20, 0, 20) for i, s in enumerate(stored) if i > 0)


async def test_branch_references_longest_shared_prefix(store: Store) -> None:
    rollout = await store.create_rollout()
    base = list(range(100, 200))
    await store.append_call(call(rollout.id, base, [1, 2, 3]))
    # The harness dropped the last 10 prompt tokens and wrote something else (a compaction).
    edited = [*base[:90], 7, 7, 7]
    await store.append_call(call(rollout.id, edited, [4]))
    # A side call that shares nothing with the main line.
    side = [5, 5, 5, 5]
    await store.append_call(call(rollout.id, side, [6]))
    # The main line continues from the edited branch.
    await store.append_call(call(rollout.id, [*edited, 4, 8, 8], [9]))

    stored = await _suffix_lengths(store, rollout.id)
    assert stored == [(0, None, 100), (90, None, 3), (0, None, 4), (94, 0, 2)]
    tokens = list((await store.rollout_tokens(rollout.id)).values())
    assert [t.prompt_ids.tolist() for t in tokens] == [
        base,
        edited,
        side,
        [*edited, 4, 8, 8],
    ]


async def test_prompt_extending_second_of_n_choices(store: Store) -> None:
    rollout = await store.create_rollout()
    await store.append_call(call(rollout.id, [1, 2, 3], [10, 11], [20, 21, 22]))
    receipt = await store.append_call(call(rollout.id, [1, 2, 3, 20, 21, 22, 30], [40]))

    assert (await _suffix_lengths(store, rollout.id))[1] == (6, 1, 1)
    tokens = await store.call_tokens(receipt.call_id)
    assert tokens.prompt_ids.tolist() == [1, 2, 3, 20, 21, 22, 30]


async def test_deltas_rebuild_after_reopening_the_store(db_url: str) -> None:
    async with opened_store(db_url) as first:
        rollout = await first.create_rollout()
        await first.append_call(call(rollout.id, [1, 2, 3], [4, 5]))

    # A new process (or a restarted proxy) has no cached calls: it must load them to delta.
    async with opened_store(db_url) as second:
        await second.append_call(call(rollout.id, [1, 2, 3, 4, 5, 6], [7]))
        assert (await _suffix_lengths(second, rollout.id))[1] == (5, 0, 1)
        tokens = list((await second.rollout_tokens(rollout.id)).values())
        assert tokens[1].prompt_ids.tolist() == [1, 2, 3, 4, 5, 6]


ids = st.lists(st.integers(0, 20), max_size=30)


@settings(max_examples=300, deadline=None)
@given(prompt=ids, earlier=st.lists(st.tuples(ids, st.lists(ids, max_size=3)), max_size=5))
def test_chosen_parent_rebuilds_the_prompt(
    prompt: list[int], earlier: list[tuple[list[int], list[list[int]]]]
) -> None:
    known = [
        KnownCall(
            f"c{i}",
            np.asarray(p, dtype=np.int32),
            {j: np.asarray(c, dtype=np.int32) for j, c in enumerate(cs)},
        )
        for i, (p, cs) in enumerate(earlier)
    ]
    target = np.asarray(prompt, dtype=np.int32)

    ref = choose_parent(target, known)

    base = np.zeros(0, dtype=np.int32)
    if ref.parent_id is not None:
        parent = next(k for k in known if k.call_id == ref.parent_id)
        base = parent.prompt
        if ref.parent_choice is not None:
            base = np.concatenate([base, parent.completions[ref.parent_choice]])
    rebuilt = np.concatenate([base[: ref.shared], ref.suffix])
    assert rebuilt.tolist() == prompt
    # No candidate sequence shares a longer prefix than the one chosen.
    for k in known:
        assert common_prefix(target, k.prompt) <= ref.shared
        for c in k.completions.values():
            full = np.concatenate([k.prompt, c])
            assert common_prefix(target, full) <= ref.shared


@pytest.mark.parametrize(
    ("a", "b", "n"), [([], [], 0), ([1], [], 0), ([1, 2], [1, 2], 2), ([1, 2, 3], [1, 5], 1)]
)
def test_common_prefix(a: list[int], b: list[int], n: int) -> None:
    assert common_prefix(np.asarray(a), np.asarray(b)) == n
