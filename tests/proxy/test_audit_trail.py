"""What the proxy refuses stays in the rollout's hash chain, where an auditor finds it."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from rolltap.audit.integrity import verify_rollout
from rolltap.store import CallStatus, Store
from tests.support.proxy import OpenAIFactory, fake_engine, new_rollout, running_proxy

MESSAGES = [{"role": "user", "content": "count to three"}]


async def test_refused_and_rejected_calls_are_chained_and_listed(
    store: Store, sdk: OpenAIFactory
) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store, max_calls=2)
        url = f"{proxy.url}/r/{key}/v1"
        async with aiohttp.ClientSession() as session:
            bad = await session.post(f"{url}/chat/completions", data=b"{not json")
            assert bad.status == 400
        client = sdk(url, max_retries=0)
        for _ in range(2):
            await client.chat.completions.create(model="m", messages=MESSAGES)
        for _ in range(2):  # the budget, then the rollout it ended
            with pytest.raises(openai.PermissionDeniedError):
                await client.chat.completions.create(model="m", messages=MESSAGES)

        result = await verify_rollout(store, rollout_id)
        calls = await store.calls(rollout_id)

    assert result.ok, result.issues
    assert [c.status for c in calls] == [CallStatus.REJECTED] + [CallStatus.OK] * 2 + [
        CallStatus.REJECTED
    ] * 2
    assert all(c.hash is not None for c in calls)
    assert [(r.seq, r.http_status) for r in result.refused] == [(1, 400), (4, 403), (5, 403)]
    assert "not valid JSON" in (result.refused[0].error or "")
    assert "budget of 2 calls" in (result.refused[1].error or "")
    assert "budget_exceeded; it takes no more calls" in (result.refused[2].error or "")
    # The budget ended the rollout before its refusal was recorded: sealed at the last answer.
    assert (result.status.value, result.head_seq, result.after_head) == ("budget_exceeded", 3, 2)
