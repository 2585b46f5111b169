"""Rollouts nobody finishes end `expired` once idle (proxy/control/expiry.py): one made by hand and
never used, one used and then left; a batch's rollout and one still calling stay as they are."""

from __future__ import annotations

import asyncio

import aiohttp

from rolltap.store import RolloutStatus, Store
from tests.support.proxy import fake_engine, new_rollout, running_proxy

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def _call(url: str, key: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{url}/r/{key}/v1/chat/completions", json=CHAT, headers={"Authorization": key}
        ) as resp:
            assert resp.status == 200, await resp.text()


async def test_idle_rollouts_outside_batches_expire(store: Store) -> None:
    async with (
        fake_engine() as engine,
        running_proxy(store, engine.url, rollout_expiry_seconds=1.0) as proxy,
    ):
        never, _ = await new_rollout(store)
        left, left_key = await new_rollout(store)
        busy, busy_key = await new_rollout(store)
        batched, _ = await new_rollout(store, batch_id="b", task_id="t", sample_index=0)
        await _call(proxy.url, left_key)

        async def expired() -> bool:
            views = {v.id: v for v in await store.rollouts()}
            return {views[never].status, views[left].status} == {RolloutStatus.EXPIRED}

        for _ in range(12):  # the busy one calls every 0.25 s for 3 s: never idle for 1 s
            await _call(proxy.url, busy_key)
            await asyncio.sleep(0.25)
        for _ in range(100):
            if await expired():
                break
            await asyncio.sleep(0.1)

    views = {v.id: v for v in await store.rollouts()}
    assert "no call for 1 s" in (views[never].error or "")
    assert views[left].status is RolloutStatus.EXPIRED
    assert views[never].finished_at is not None
    assert views[busy].status is RolloutStatus.RUNNING
    assert views[batched].status is RolloutStatus.PENDING, "a batch's runner ends its own"
