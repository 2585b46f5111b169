"""Budgets hold against a policy that fires many calls at once or sends bad ones on purpose."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import aiohttp
import orjson

from rolltap.store import CallStatus, RolloutStatus, Store
from tests.support.fake_vllm import FakeVLLM, Reply, render
from tests.support.proxy import fake_engine, new_rollout, running_proxy

MESSAGES = [{"role": "user", "content": "count to ten slowly"}]
LONG = "0123456789" * 8


async def _post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        return resp.status, orjson.loads(await resp.read())


async def _burst(url: str, body: dict[str, Any], n: int) -> Counter[int]:
    results = await asyncio.gather(*(_post(url, body) for _ in range(n)))
    return Counter(status for status, _ in results)


def slow(text: str = LONG) -> FakeVLLM:
    """An engine slow enough that every call of a burst is in flight at once."""
    return FakeVLLM(script=lambda body: Reply(text=text, token_delay=0.005))


async def test_rejected_calls_never_count_against_max_calls(store: Store) -> None:
    good = {"model": "m", "messages": MESSAGES}
    async with fake_engine() as engine:
        rollout_id, key = await new_rollout(store, max_calls=2)
        async with running_proxy(store, engine.url) as proxy:
            url = f"{proxy.url}/r/{key}/v1/chat/completions"
            for _ in range(3):
                assert (await _post(url, {"messages": []}))[0] == 400
        # A proxy that reads the rollout afresh (a restart, or the refresh every few seconds)
        # counts from the store, where the three refusals are recorded.
        async with running_proxy(store, engine.url) as proxy:
            url = f"{proxy.url}/r/{key}/v1/chat/completions"
            assert [(await _post(url, good))[0] for _ in range(3)] == [200, 200, 403]

    statuses = [c.status for c in await store.calls(rollout_id)]
    assert statuses.count(CallStatus.REJECTED) == 4
    assert statuses.count(CallStatus.OK) == 2
    assert len(engine.fake.requests) == 2
    assert (await store.rollout(rollout_id)).status is RolloutStatus.BUDGET_EXCEEDED


async def test_a_burst_of_concurrent_calls_cannot_pass_max_calls(store: Store) -> None:
    async with fake_engine(slow()) as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store, max_calls=3)
        url = f"{proxy.url}/r/{key}/v1/chat/completions"

        statuses = await _burst(url, {"model": "m", "messages": MESSAGES}, 16)

    assert statuses == Counter({200: 3, 403: 13})
    assert engine.fake.served == 3
    recorded = Counter(c.status for c in await store.calls(rollout_id))
    assert recorded == Counter({CallStatus.OK: 3, CallStatus.REJECTED: 13})
    assert (await store.rollout(rollout_id)).status is RolloutStatus.BUDGET_EXCEEDED


async def test_a_burst_of_concurrent_calls_cannot_overshoot_the_token_budget(
    store: Store,
) -> None:
    prompt = len(render(MESSAGES, None))
    budget = 3 * (prompt + 10) + 5
    async with fake_engine(slow()) as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store, max_tokens=budget)
        url = f"{proxy.url}/r/{key}/v1/chat/completions"

        statuses = await _burst(url, {"model": "m", "messages": MESSAGES, "max_tokens": 10}, 16)

    calls = await store.calls(rollout_id)
    used = sum(c.prompt_tokens + c.completion_tokens for c in calls)
    # Generation is clamped to what is left; only a lone last call's prompt may pass the budget.
    assert used <= budget + prompt
    assert engine.fake.served == statuses[200] <= 4
    assert statuses[200] + statuses[403] == 16
    assert all(c.completion_tokens <= 10 for c in calls)
    assert (await store.rollout(rollout_id)).status is RolloutStatus.BUDGET_EXCEEDED


async def test_max_tokens_is_lowered_to_what_is_left_of_the_budget(store: Store) -> None:
    prompt = len(render(MESSAGES, None))
    async with fake_engine(slow()) as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store, max_tokens=2 * prompt + 12 + 7)
        url = f"{proxy.url}/r/{key}/v1/chat/completions"

        first = await _post(url, {"model": "m", "messages": MESSAGES, "max_tokens": 12})
        second = await _post(url, {"model": "m", "messages": MESSAGES, "max_tokens": 500})
        third = await _post(url, {"model": "m", "messages": MESSAGES, "max_tokens": 500})

    assert (first[0], second[0], third[0]) == (200, 200, 403)
    sent = [body["max_tokens"] for _, _, body in engine.fake.requests]
    # What was left after the first call: its prompt and 12 tokens are spent, and the second
    # prompt is not known before the engine answers.
    assert sent == [12, prompt + 7]
    first_call, second_call, _ = await store.calls(rollout_id)
    assert first_call.error is None
    assert second_call.error is not None
    assert "lowered to" in second_call.error
    assert "token budget" in second_call.error
    assert third[1]["error"]["code"] == "rollout_budget_exceeded"


async def test_a_pending_rollout_can_end_as_budget_exceeded(store: Store) -> None:
    async with fake_engine(slow()) as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store, max_calls=1)
        url = f"{proxy.url}/r/{key}/v1/chat/completions"
        body = {"model": "m", "messages": MESSAGES}
        first = asyncio.create_task(_post(url, body))
        while engine.fake.served == 0:
            await asyncio.sleep(0.01)

        # The first call is still with the engine, so the rollout has not started yet.
        assert (await store.rollout(rollout_id)).status is RolloutStatus.PENDING
        status, error = await _post(url, body)
        assert (status, error["error"]["code"]) == (403, "rollout_budget_exceeded")
        assert (await store.rollout(rollout_id)).status is RolloutStatus.BUDGET_EXCEEDED

        assert (await first)[0] == 200
    # The first call's record did not move the finished rollout back to running.
    assert (await store.rollout(rollout_id)).status is RolloutStatus.BUDGET_EXCEEDED


async def test_calls_wait_for_a_reservation_instead_of_failing(store: Store) -> None:
    prompt = len(render(MESSAGES, None))
    # Room for one call's generation at a time next to its prompt estimate, and for four calls
    # in all: reservations, not spent tokens, hold the second call back until the first ends.
    async with fake_engine(slow("done")) as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store, max_tokens=4 * (prompt + 5))
        url = f"{proxy.url}/r/{key}/v1/chat/completions"

        statuses = await _burst(url, {"model": "m", "messages": MESSAGES, "max_tokens": 50}, 3)

    assert statuses == Counter({200: 3})
    calls = await store.calls(rollout_id)
    assert [c.status for c in calls] == [CallStatus.OK] * 3
