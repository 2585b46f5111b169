"""Prefix caching through the API: later prompts reuse what earlier sequences computed, and answer
exactly what they would without the cache.

The reference answer of each test comes from the same engine with a fresh `cache_salt` (vLLM's
field: salted requests only share entries with the same salt, so a fresh salt finds none); /stats
proves that the unsalted request did reuse the cache, and how much of it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import aiohttp
import pytest

from rolltap.engine.launch import EngineProcess
from tests.support.engine import engine_stats, post_json, wait_until_idle

pytestmark = pytest.mark.model

LOGPROB_TOLERANCE = 1e-4
"""Reused keys/values were computed in other chunks or decode steps, so float sums may differ in
order; measured differences are around 1e-5."""


def assert_same_answer(cached: dict[str, Any], fresh: dict[str, Any]) -> None:
    assert cached["token_ids"] == fresh["token_ids"]
    assert cached["logprobs"] == pytest.approx(fresh["logprobs"], abs=LOGPROB_TOLERANCE)


async def complete(
    engine: EngineProcess, prompt: list[int], max_tokens: int, **fields: Any
) -> dict[str, Any]:
    body = {
        "model": engine.model,
        "prompt": prompt,
        "temperature": 0,
        "max_tokens": max_tokens,
        "logprobs": 1,
        "return_token_ids": True,
        **fields,
    }
    status, answer = await post_json(engine.url, "/v1/completions", body)
    assert status == 200, answer
    choice = answer["choices"][0]
    return {**choice, "logprobs": choice["logprobs"]["token_logprobs"]}


async def chat(engine: EngineProcess, messages: list[dict[str, Any]], **fields: Any) -> Any:
    body = {
        "model": engine.model,
        "messages": messages,
        "temperature": 0,
        "max_tokens": 24,
        "logprobs": True,
        "return_token_ids": True,
        **fields,
    }
    status, answer = await post_json(engine.url, "/v1/chat/completions", body)
    assert status == 200, answer
    return answer


def chat_answer(answer: dict[str, Any]) -> dict[str, Any]:
    choice = answer["choices"][0]
    logprobs = [e["logprob"] for e in choice["logprobs"]["content"]]
    return {"token_ids": choice["token_ids"], "logprobs": logprobs}


async def reuse_of(engine: EngineProcess, request: Any) -> tuple[Any, int, int]:
    """Run `request`; return its result, and the prefix-cache hits and tokens it reused."""
    before = await engine_stats(engine.url)
    result = await request
    after = await engine_stats(engine.url)
    hits = after["prefix_cache_hits"] - before["prefix_cache_hits"]
    return result, hits, after["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"]


async def test_a_second_turn_reuses_the_first_and_answers_the_same(
    smollm_engine: EngineProcess,
) -> None:
    tag = uuid.uuid4().hex
    messages = [
        {"role": "system", "content": f"You are a terse assistant (session {tag})."},
        {"role": "user", "content": "Name three fruits."},
    ]
    first = await chat(smollm_engine, messages)
    messages += [
        {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And three vegetables?"},
    ]
    fresh = await chat(smollm_engine, messages, cache_salt=f"fresh-{tag}")
    cached, hits, reused = await reuse_of(smollm_engine, chat(smollm_engine, messages))
    assert cached["prompt_token_ids"] == fresh["prompt_token_ids"]
    assert_same_answer(chat_answer(cached), chat_answer(fresh))
    assert hits == 1
    assert len(first["prompt_token_ids"]) <= reused < len(cached["prompt_token_ids"])


async def test_a_salt_only_shares_with_its_own_salt(smollm_engine: EngineProcess) -> None:
    tag = uuid.uuid4().hex
    messages = [{"role": "user", "content": f"Say hello to {tag}."}]
    first = await chat(smollm_engine, messages, max_tokens=2, cache_salt=tag)
    whole = len(first["prompt_token_ids"]) - 1  # the last prompt token is always computed

    async def reused(**fields: Any) -> int:
        return (await reuse_of(smollm_engine, chat(smollm_engine, messages, **fields)))[2]

    assert await reused(max_tokens=1, cache_salt=tag + "-other") == 0
    assert await reused(max_tokens=1) < whole - 8  # the template's opening, not the message
    assert await reused(max_tokens=1, cache_salt=tag) == whole


async def test_only_computed_ids_of_a_stopped_sequence_are_reused(
    smollm_engine: EngineProcess, tokenizer: Any
) -> None:
    prompt = tokenizer(f"Note {uuid.uuid4().hex}: once upon a time")["input_ids"]
    stops = ["e", "a", "\n"]  # soon met, often inside a token: the text ends mid-token
    first = await complete(smollm_engine, prompt, 40, stop=stops)
    assert first["finish_reason"] == "stop"
    assert first["stop_reason"] in stops
    # The next prompt holds every sampled id, but the one that completed the stop string was
    # never fed back: its keys/values do not exist and must be computed.
    extra = tokenizer(" and then the", add_special_tokens=False)["input_ids"]
    follow = prompt + first["token_ids"] + extra
    fresh = await complete(smollm_engine, follow, 8, cache_salt=uuid.uuid4().hex)
    cached, hits, reused = await reuse_of(smollm_engine, complete(smollm_engine, follow, 8))
    assert_same_answer(cached, fresh)
    assert hits == 1
    assert reused == len(prompt) + len(first["token_ids"]) - 1


async def test_a_cancelled_stream_leaves_what_it_computed(
    smollm_engine: EngineProcess, tokenizer: Any
) -> None:
    prompt = tokenizer(f"Tale {uuid.uuid4().hex}: the old lighthouse keeper")["input_ids"]
    before = await engine_stats(smollm_engine.url)
    received: list[int] = []
    body = {
        "model": smollm_engine.model,
        "prompt": prompt,
        "temperature": 0,
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(smollm_engine.url + "/v1/completions", json=body) as resp,
    ):
        async for line in resp.content:
            if line.startswith(b"data: {"):
                received += json.loads(line[len(b"data: ") :])["choices"][0]["token_ids"]
            if len(received) >= 6:
                break
    after = await wait_until_idle(smollm_engine.url)
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
    follow = prompt + received + tokenizer("\n\nTHE END", add_special_tokens=False)["input_ids"]
    fresh = await complete(smollm_engine, follow, 8, cache_salt=uuid.uuid4().hex)
    cached, hits, reused = await reuse_of(smollm_engine, complete(smollm_engine, follow, 8))
    assert_same_answer(cached, fresh)
    assert hits == 1
    # The engine may have run ahead of what the client read before the cancellation landed.
    assert reused >= len(prompt) + len(received) - 1


async def test_a_prompt_cancelled_during_prefill_leaves_its_computed_chunks(
    smollm_engine: EngineProcess, tokenizer: Any
) -> None:
    lines = " ".join(f"line {i}: all systems nominal." for i in range(110))
    prompt = tokenizer(f"Log {uuid.uuid4().hex}. {lines}")["input_ids"]
    assert len(prompt) > 3 * 256  # more than three prefill chunks
    before = await engine_stats(smollm_engine.url)
    body = {"model": smollm_engine.model, "prompt": prompt, "max_tokens": 4, "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(smollm_engine.url + "/v1/completions", json=body) as resp,
    ):
        assert resp.status == 200
        one_chunk = before["prompt_tokens"] + 256
        while (await engine_stats(smollm_engine.url))["prompt_tokens"] < one_chunk:
            await asyncio.sleep(0.05)
    after = await wait_until_idle(smollm_engine.url)
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
    follow = prompt + tokenizer(" Status:", add_special_tokens=False)["input_ids"]
    fresh = await complete(smollm_engine, follow, 4, cache_salt=uuid.uuid4().hex)
    cached, hits, reused = await reuse_of(smollm_engine, complete(smollm_engine, follow, 4))
    assert_same_answer(cached, fresh)
    assert hits == 1
    assert reused >= 256
