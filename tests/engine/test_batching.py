"""Concurrent requests share batched forward passes, stream as they go, and cancel on disconnect."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from rolltap.engine.launch import EngineProcess
from tests.support.engine import engine_stats, post_json, wait_until_idle

pytestmark = pytest.mark.model

QUESTIONS = [
    "What is 2+2?",
    "Tell me a story about a cat.",
    "Name three colors.",
    "What is the capital of France?",
    "Write a haiku.",
    "Why is the sky blue?",
    "Count to ten.",
    "Who wrote Hamlet?",
]


async def stream_chat(
    session: aiohttp.ClientSession,
    engine: EngineProcess,
    index: int,
    log: list[tuple[str, int]],
    max_tokens: int = 24,
) -> list[int]:
    body = {
        "model": engine.model,
        "messages": [{"role": "user", "content": QUESTIONS[index]}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    ids: list[int] = []
    async with session.post(engine.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            choice = json.loads(line[len(b"data: ") :])["choices"][0]
            if "token_ids" not in choice:
                continue
            if not ids:
                log.append(("first", index))
            ids += choice["token_ids"]
            if choice["finish_reason"] is not None:
                log.append(("done", index))
    return ids


async def test_eight_streams_are_decoded_together_and_stream_as_they_go(
    smollm_engine: EngineProcess,
) -> None:
    before = await engine_stats(smollm_engine.url)
    log: list[tuple[str, int]] = []
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(
            *(stream_chat(session, smollm_engine, i, log) for i in range(8))
        )
    after = await engine_stats(smollm_engine.url)
    assert [len(ids) for ids in results] == [24] * 8
    by_batch_before = before["decode_steps_by_batch"]
    by_batch_after = after["decode_steps_by_batch"]
    assert by_batch_after.get("8", 0) > by_batch_before.get("8", 0)
    assert after["max_batch_seen"] >= 8
    assert after["batched_decode_steps"] > before["batched_decode_steps"]
    # every stream had tokens before any finished: they were served side by side, not in turn
    kinds = [kind for kind, _ in log]
    assert kinds.index("done") > max(i for i, kind in enumerate(kinds) if kind == "first")


async def greedy(engine: EngineProcess, index: int) -> dict[str, Any]:
    body = {
        "model": engine.model,
        "messages": [{"role": "user", "content": QUESTIONS[index]}],
        "temperature": 0,
        "max_tokens": 12,
        "logprobs": True,
        "top_logprobs": 2,
        "return_token_ids": True,
    }
    status, answer = await post_json(engine.url, "/v1/chat/completions", body)
    assert status == 200
    return answer["choices"][0]  # type: ignore[no-any-return]


async def test_batched_rows_match_their_single_runs(smollm_engine: EngineProcess) -> None:
    together = await asyncio.gather(*(greedy(smollm_engine, i) for i in range(4)))
    for index, batched in enumerate(together):
        alone = await greedy(smollm_engine, index)
        same = [a == b for a, b in zip(alone["token_ids"], batched["token_ids"], strict=False)]
        if all(same):
            assert alone["token_ids"] == batched["token_ids"]
            continue
        # Batched matmuls may round differently: only an exact tie may flip the greedy choice.
        at = same.index(False)
        top = alone["logprobs"]["content"][at]["top_logprobs"]
        assert top[0]["logprob"] - top[1]["logprob"] < 1e-3


async def test_a_disconnected_stream_is_cancelled(smollm_engine: EngineProcess) -> None:
    before = await engine_stats(smollm_engine.url)
    body = {
        "model": smollm_engine.model,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 4000,
        "ignore_eos": True,
        "stream": True,
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(smollm_engine.url + "/v1/chat/completions", json=body) as resp,
    ):
        frames = 0
        async for line in resp.content:
            frames += line.startswith(b"data: ")
            if frames == 3:
                break
    after = await wait_until_idle(smollm_engine.url)
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
    assert after["generated_tokens"] - before["generated_tokens"] < 4000


async def test_a_client_that_gives_up_on_a_plain_request_cancels_it(
    smollm_engine: EngineProcess,
) -> None:
    before = await engine_stats(smollm_engine.url)
    body = {
        "model": smollm_engine.model,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 4000,
        "ignore_eos": True,
    }
    timeout = aiohttp.ClientTimeout(total=2)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        with pytest.raises(TimeoutError):
            async with session.post(smollm_engine.url + "/v1/chat/completions", json=body):
                pass
    after = await wait_until_idle(smollm_engine.url)
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
