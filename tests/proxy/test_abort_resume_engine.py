"""abort_resume on the real SmolLM2 engine: an answer cut by a weight update and continued
token-in is, token for token, the answer the engine gives uninterrupted (greedy decoding, the
same weights on both sides of the commit), and its logprobs match."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import numpy as np
import pytest

from rolltap.engine.launch import EngineProcess
from rolltap.store import Store
from tests.support.engine import engine_stats
from tests.support.proxy import OpenAIFactory, running_proxy

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
LENGTH = 40
SAME = 1e-4
"""Greedy logprobs of the same tokens computed in other chunks of work (see the prefix tests)."""


async def _answer_ids(store: Store, rollout_id: str) -> tuple[list[int], list[float]]:
    ids: list[int] = []
    logprobs: list[float] = []
    for call in sorted(await store.calls(rollout_id), key=lambda c: c.seq):
        tokens = await store.call_tokens(call.id)
        ids += tokens.choices[0].token_ids.tolist()
        assert tokens.choices[0].logprobs is not None
        logprobs += tokens.choices[0].logprobs.tolist()
    return ids, logprobs


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_resumed_answer_is_the_uninterrupted_answer(
    store: Store, sdk: OpenAIFactory, smollm_engine: EngineProcess, stream: bool
) -> None:
    request: dict[str, Any] = {
        "model": smollm_engine.model,
        "messages": MESSAGES,
        "max_tokens": LENGTH,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    async with running_proxy(store, smollm_engine.url, weight_version="1") as proxy:
        reference = await store.create_rollout()
        client = sdk(f"{proxy.url}/r/{reference.key}/v1", max_retries=0)
        expected = (await client.chat.completions.create(**request)).choices[0].message.content

        resumed = await store.create_rollout()
        client = sdk(f"{proxy.url}/r/{resumed.key}/v1", max_retries=0)

        async def ask() -> str:
            if not stream:
                answer = await client.chat.completions.create(**request)
                return answer.choices[0].message.content or ""
            parts = []
            async for chunk in await client.chat.completions.create(**request, stream=True):
                parts += [c.delta.content or "" for c in chunk.choices]
            return "".join(parts)

        before = (await engine_stats(smollm_engine.url))["generated_tokens"]
        asking = asyncio.create_task(ask())
        for _ in range(1000):
            stats = await engine_stats(smollm_engine.url)
            if stats["generated_tokens"] - before >= 8:
                break
            await asyncio.sleep(0.02)
        async with aiohttp.ClientSession() as session:
            for path, body in [
                ("/v1/weights/begin", {"mode": "abort_resume"}),
                ("/v1/weights/commit", {"version": "2"}),
            ]:
                async with session.post(proxy.url + path, json=body) as resp:
                    assert resp.status == 200, await resp.text()
        text = await asking

    assert text == expected
    calls = sorted(await store.calls(resumed.id), key=lambda c: c.seq)
    assert [c.weight_version for c in calls] == ["1", "2"]
    assert [c.finish_reason for c in calls] == ["abort", "length"]
    assert calls[1].resumes == calls[0].id
    assert 8 <= calls[0].completion_tokens < LENGTH
    got, got_logprobs = await _answer_ids(store, resumed.id)
    want, want_logprobs = await _answer_ids(store, reference.id)
    assert got == want
    np.testing.assert_allclose(got_logprobs, want_logprobs, atol=SAME)


async def test_the_proxy_reads_the_version_the_engine_reports(
    store: Store, sdk: OpenAIFactory, smollm_engine: EngineProcess
) -> None:
    """The engine's spans (vLLM's `weight_versions`, asked for by the client here) are read; the
    proxy's own version wins when it has one, and a disagreement is noted on the call."""
    request: dict[str, Any] = {
        "model": smollm_engine.model,
        "messages": MESSAGES,
        "max_tokens": 4,
        "extra_body": {"return_weight_versions": True},
    }
    async with running_proxy(store, smollm_engine.url) as proxy:
        unlabelled = await store.create_rollout()
        client = sdk(f"{proxy.url}/r/{unlabelled.key}/v1", max_retries=0)
        await client.chat.completions.create(**request)
    async with running_proxy(store, smollm_engine.url, weight_version="7") as proxy:
        labelled = await store.create_rollout()
        client = sdk(f"{proxy.url}/r/{labelled.key}/v1", max_retries=0)
        await client.chat.completions.create(**request)

    # The engine is shared by this module's tests: an earlier update may have relabelled it.
    async with (
        aiohttp.ClientSession() as session,
        session.get(smollm_engine.url + "/weight_info") as resp,
    ):
        serving = (await resp.json())["weight_version"]
    (read,) = await store.calls(unlabelled.id)
    (noted,) = await store.calls(labelled.id)
    assert read.weight_version == serving
    assert read.error is None
    assert noted.weight_version == "7"
    assert f"the engine reported weight version {serving!r}" in (noted.error or "")
