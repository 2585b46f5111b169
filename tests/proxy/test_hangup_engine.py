"""A client that hangs up on a whole (non-streaming) answer stops the real engine's work at
once, as a stream's does: nothing keeps a core busy for an answer nobody will read."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from rolltap.engine.launch import EngineProcess
from rolltap.store import CallStatus, Store
from tests.support.engine import engine_stats, wait_until_idle
from tests.support.proxy import new_rollout, running_proxy

pytestmark = pytest.mark.model


async def test_a_hung_up_whole_answer_cancels_the_engine_request(
    store: Store, smollm_engine: EngineProcess
) -> None:
    body = {
        "model": smollm_engine.model,
        "messages": [{"role": "user", "content": "Tell a very long story."}],
        "max_tokens": 4000,
        "ignore_eos": True,
    }
    before = await engine_stats(smollm_engine.url)
    rollout_id, key = await new_rollout(store)
    async with running_proxy(store, smollm_engine.url) as proxy:
        url = f"{proxy.url}/r/{key}/v1/chat/completions"
        async with aiohttp.ClientSession() as session:
            call = asyncio.ensure_future(session.post(url, json=body))
            while (await engine_stats(smollm_engine.url))["generated_tokens"] < (
                before["generated_tokens"] + 5
            ):
                await asyncio.sleep(0.05)
            call.cancel()  # the client gives up mid-generation and closes its connection
            hung_up = time.monotonic()
        after = await wait_until_idle(smollm_engine.url)
        stopped_after = time.monotonic() - hung_up
        # 4,000 tokens take minutes here; the engine stopped long before, with far fewer.
        assert after["requests_cancelled"] == before["requests_cancelled"] + 1
        assert after["generated_tokens"] - before["generated_tokens"] < 1000, stopped_after
        for _ in range(100):
            calls = await store.calls(rollout_id)
            if calls:
                break
            await asyncio.sleep(0.05)
    assert [c.status for c in calls] == [CallStatus.CANCELLED]
