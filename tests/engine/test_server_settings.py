"""Server settings that bound requests: --max-tokens-cap, --default-max-tokens, --max-model-len
beyond the trained length, and --no-prefix-caching, on a second engine started with them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from rolltap.engine.launch import EngineProcess
from tests.support.engine import engine_stats, get_json, post_json

pytestmark = pytest.mark.model

CAP = 24
DEFAULT = 6
LONG_CONTEXT = 9000
"""Above SmolLM2's trained 8192."""


@pytest.fixture(scope="module")
def bounded_engine() -> Iterator[EngineProcess]:
    engine = EngineProcess.start(
        extra_args=(
            "--no-prefix-caching",
            "--max-tokens-cap",
            str(CAP),
            "--default-max-tokens",
            str(DEFAULT),
            "--max-model-len",
            str(LONG_CONTEXT),
        )
    )
    try:
        yield engine
    finally:
        engine.stop()


async def chat(engine: EngineProcess, content: str, **fields: Any) -> tuple[int, Any]:
    body = {
        "model": engine.model,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        **fields,
    }
    return await post_json(engine.url, "/v1/chat/completions", body)


async def test_the_settings_are_announced_and_reported(bounded_engine: EngineProcess) -> None:
    log = bounded_engine.log_path.read_text()
    assert "--max-model-len 9000 is above the model's trained context length of 8192" in log
    assert "prefix caching off" in log
    assert f"max_tokens: default {DEFAULT}, cap {CAP}" in log
    stats = await engine_stats(bounded_engine.url)
    assert stats["settings"] == {
        "max_model_len": LONG_CONTEXT,
        "trained_max_model_len": 8192,
        "prefix_caching": False,
        "prefix_cache_capacity_tokens": 0,
        "default_max_tokens": DEFAULT,
        "max_tokens_cap": CAP,
    }
    status, models = await get_json(bounded_engine.url, "/v1/models")
    assert status == 200
    assert models["data"][0]["max_model_len"] == LONG_CONTEXT


async def test_the_default_engine_reports_vllm_behaviour(smollm_engine: EngineProcess) -> None:
    stats = await engine_stats(smollm_engine.url)
    assert stats["settings"] == {
        "max_model_len": 8192,
        "trained_max_model_len": 8192,
        "prefix_caching": True,
        "prefix_cache_capacity_tokens": 32768,
        "default_max_tokens": None,
        "max_tokens_cap": None,
    }


@pytest.mark.parametrize(
    ("fields", "generated"),
    [
        ({}, DEFAULT),
        ({"max_tokens": 10}, 10),
        ({"max_tokens": 1000}, CAP),
        ({"max_completion_tokens": 100}, CAP),
        ({"max_tokens": 32000}, CAP),  # beyond the context too: clamped, not refused
    ],
)
async def test_max_tokens_take_the_default_and_are_capped(
    bounded_engine: EngineProcess, fields: dict[str, Any], generated: int
) -> None:
    status, answer = await chat(bounded_engine, "Tell me a long story.", **fields)
    assert status == 200, answer
    choice = answer["choices"][0]
    assert len(choice["token_ids"]) == generated
    assert choice["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == generated


async def test_a_prompt_over_the_context_is_refused_with_vllms_message(
    bounded_engine: EngineProcess, smollm_engine: EngineProcess
) -> None:
    for engine, limit in ((bounded_engine, LONG_CONTEXT), (smollm_engine, 8192)):
        body = {"model": engine.model, "prompt": [198] * (limit + 5), "max_tokens": 4}
        status, answer = await post_json(engine.url, "/v1/completions", body)
        assert status == 400
        assert answer["error"]["message"] == (
            f"This model's maximum context length is {limit} tokens. However, your request has "
            f"{limit + 5} input tokens. Please reduce the length of the input messages."
        )
    # Within the cap, a max_tokens that does not fit is vLLM's 400, not silently clamped.
    body = {"model": bounded_engine.model, "prompt": [198] * 8990, "max_tokens": 20}
    status, answer = await post_json(bounded_engine.url, "/v1/completions", body)
    assert status == 400
    assert answer["error"]["param"] == "max_tokens"
    assert "(20 > 9000 - 8990)" in answer["error"]["message"]


async def test_without_prefix_caching_a_second_turn_answers_the_same(
    bounded_engine: EngineProcess, smollm_engine: EngineProcess
) -> None:
    """The same conversation on two engine processes, one with prefix caching and one without."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are a careful assistant ({uuid.uuid4().hex})."},
        {"role": "user", "content": "What is the tallest mountain?"},
    ]
    body = {"temperature": 0, "max_tokens": 20, "logprobs": True, "return_token_ids": True}

    async def ask(engine: EngineProcess) -> Any:
        status, answer = await post_json(
            engine.url, "/v1/chat/completions", {**body, "messages": messages}
        )
        assert status == 200, answer
        return answer

    first = await ask(smollm_engine)
    messages += [
        {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
        {"role": "user", "content": "How high is it?"},
    ]
    before = await engine_stats(smollm_engine.url)
    cached = await ask(smollm_engine)
    after = await engine_stats(smollm_engine.url)
    uncached = await ask(bounded_engine)
    assert after["prefix_cache_hits"] == before["prefix_cache_hits"] + 1
    assert after["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"] >= len(
        first["prompt_token_ids"]
    )
    assert cached["prompt_token_ids"] == uncached["prompt_token_ids"]
    got, expected = cached["choices"][0], uncached["choices"][0]
    assert got["token_ids"] == expected["token_ids"]
    logprobs = [[e["logprob"] for e in c["logprobs"]["content"]] for c in (got, expected)]
    assert logprobs[0] == pytest.approx(logprobs[1], abs=1e-4)
    stats = await engine_stats(bounded_engine.url)
    assert (stats["prefix_cache_lookups"], stats["prefix_cache_tokens"]) == (0, 0)
