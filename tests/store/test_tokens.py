"""Token arrays survive the store exactly, and bad ones are refused before anything is written."""

from __future__ import annotations

import numpy as np
import pytest

from rolltap.store import InvalidTokens, NewRollout, Store
from tests.support.records import call


@pytest.mark.parametrize(
    ("prompt_len", "completion_len"),
    [(0, 0), (1, 1), (0, 5), (200_000, 3), (7, 200_000)],
    ids=["empty", "one-token", "empty-prompt", "200k-prompt", "200k-completion"],
)
async def test_token_arrays_round_trip(store: Store, prompt_len: int, completion_len: int) -> None:
    rng = np.random.default_rng(prompt_len + completion_len)
    rollout = await store.create_rollout()
    prompt = rng.integers(0, 2**31 - 1, prompt_len)
    completion = rng.integers(0, 2**31 - 1, completion_len)
    logprobs = -rng.exponential(1.0, completion_len).astype(np.float32)
    receipt = await store.append_call(call(rollout.id, prompt, completion, logprobs=[logprobs]))

    tokens = await store.call_tokens(receipt.call_id)

    assert tokens.prompt_ids.dtype == np.int32
    np.testing.assert_array_equal(tokens.prompt_ids, prompt)
    np.testing.assert_array_equal(tokens.choices[0].token_ids, completion)
    assert tokens.choices[0].logprobs is not None
    np.testing.assert_array_equal(tokens.choices[0].logprobs, logprobs)


async def test_ids_above_2_17_and_extreme_logprobs_are_exact(store: Store) -> None:
    rollout = await store.create_rollout()
    ids = [2**17, 2**17 + 1, 151_645, 2**24 + 3, 2**31 - 1]
    logprobs = [0.0, -1e-9, -9999.0, float("-inf"), -0.5]
    receipt = await store.append_call(call(rollout.id, ids, ids[::-1], logprobs=[logprobs]))

    tokens = await store.call_tokens(receipt.call_id)

    assert tokens.prompt_ids.tolist() == ids
    assert tokens.choices[0].token_ids.tolist() == ids[::-1]
    assert tokens.choices[0].logprobs is not None
    assert tokens.choices[0].logprobs.tolist() == np.asarray(logprobs, np.float32).tolist()


async def test_all_n_choices_are_kept(store: Store) -> None:
    rollout = await store.create_rollout()
    receipt = await store.append_call(call(rollout.id, [1, 2, 3], [4, 5], [6], [], [7, 8, 9]))

    tokens = await store.call_tokens(receipt.call_id)

    assert [c.token_ids.tolist() for c in tokens.choices] == [[4, 5], [6], [], [7, 8, 9]]
    assert (await store.call(receipt.call_id)).n_choices == 4


@pytest.mark.parametrize(
    ("prompt", "completion", "logprobs", "message"),
    [
        ([1, -2, 3], [4], [-0.1], "range"),
        ([1, 2], [2**31], [-0.1], "range"),
        ([1, 2], [3, 4], [-0.1, float("nan")], "NaN"),
        ([1, 2], [3], [0.5], "positive"),
        ([1, 2], [3], [float("inf")], "positive"),
        ([1, 2], [3, 4], [-0.1], "2 token ids"),
        ([[1, 2]], [3], [-0.1], "flat"),
        ([1.5, 2.0], [3], [-0.1], "integers"),
    ],
)
async def test_bad_tokens_are_refused_and_nothing_is_written(
    store: Store,
    prompt: list[int],
    completion: list[int],
    logprobs: list[float],
    message: str,
) -> None:
    rollout = await store.create_rollout()
    await store.append_call(call(rollout.id, [9, 9], [9]))

    with pytest.raises(InvalidTokens, match=message):
        await store.append_call(call(rollout.id, prompt, completion, logprobs=[logprobs]))

    assert [c.seq for c in await store.calls(rollout.id)] == [1]


async def test_text_only_call_without_logprobs(store: Store) -> None:
    rollout = await store.create_rollout(NewRollout(task_id="t"))
    receipt = await store.append_call(call(rollout.id, [1, 2], [3, 4], logprobs=[None]))

    tokens = await store.call_tokens(receipt.call_id)

    assert tokens.choices[0].logprobs is None
    assert tokens.choices[0].token_ids.tolist() == [3, 4]
