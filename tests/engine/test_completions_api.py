"""/v1/completions: text and token-in prompts, vLLM's per-choice ids, streaming."""

from __future__ import annotations

from typing import Any

import pytest
from openai import AsyncOpenAI

from rolltap.engine.launch import EngineProcess
from tests.support.engine import post_json, post_sse

pytestmark = pytest.mark.model

QUESTION = [{"role": "user", "content": "What is 2+2?"}]


async def complete(engine: EngineProcess, **fields: Any) -> dict[str, Any]:
    body = {"model": engine.model, "temperature": 0, **fields}
    status, answer = await post_json(engine.url, "/v1/completions", body)
    assert status == 200, answer
    return answer  # type: ignore[no-any-return]


async def test_token_in_gives_the_chat_completion(smollm_engine: EngineProcess) -> None:
    body = {"model": smollm_engine.model, "messages": QUESTION, "temperature": 0}
    status, chat = await post_json(
        smollm_engine.url,
        "/v1/chat/completions",
        {**body, "return_token_ids": True, "max_tokens": 30},
    )
    assert status == 200
    answer = await complete(
        smollm_engine, prompt=chat["prompt_token_ids"], return_token_ids=True, max_tokens=30
    )
    assert answer["object"] == "text_completion"
    assert answer["id"].startswith("cmpl-")
    [choice] = answer["choices"]
    assert choice["prompt_token_ids"] == chat["prompt_token_ids"]
    assert choice["token_ids"] == chat["choices"][0]["token_ids"]
    assert choice["text"] == chat["choices"][0]["message"]["content"]
    assert choice["finish_reason"] == chat["choices"][0]["finish_reason"]


async def test_a_list_of_id_lists_gives_a_choice_per_prompt(
    smollm_engine: EngineProcess, tokenizer: Any
) -> None:
    prompts = [
        tokenizer("The capital of France is")["input_ids"],
        tokenizer("1, 2, 3,")["input_ids"],
    ]
    answer = await complete(smollm_engine, prompt=prompts, max_tokens=4, return_token_ids=True)
    choices = answer["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert [c["prompt_token_ids"] for c in choices] == prompts
    for choice, prompt in zip(choices, prompts, strict=True):
        alone = await complete(smollm_engine, prompt=prompt, max_tokens=4, return_token_ids=True)
        assert choice["token_ids"] == alone["choices"][0]["token_ids"]
        assert choice["finish_reason"] == "length"
    assert answer["usage"]["prompt_tokens"] == sum(len(p) for p in prompts)
    assert answer["usage"]["completion_tokens"] == 8


async def test_text_prompt_and_logprobs_in_the_legacy_shape(
    smollm_engine: EngineProcess, tokenizer: Any
) -> None:
    answer = await complete(
        smollm_engine,
        prompt="The capital of France is",
        max_tokens=5,
        logprobs=2,
        return_token_ids=True,
    )
    [choice] = answer["choices"]
    assert choice["prompt_token_ids"] == tokenizer("The capital of France is")["input_ids"]
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(choice["token_ids"]) == 5
    assert logprobs["tokens"] == [tokenizer.decode([i]) for i in choice["token_ids"]]
    assert all(lp <= 0 for lp in logprobs["token_logprobs"])
    for token, value, top in zip(
        logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        assert top[token] == value
        assert len(top) == 2  # greedy: the sampled token is one of the top 2
    offsets = logprobs["text_offset"]
    assert offsets == sorted(offsets)
    assert choice["text"] == tokenizer.decode(choice["token_ids"], skip_special_tokens=True)


async def test_streamed_completion_ids_match(smollm_engine: EngineProcess) -> None:
    prompt = [1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520, 9531, 198]
    whole = await complete(smollm_engine, prompt=prompt, max_tokens=12, return_token_ids=True)
    frames = await post_sse(
        smollm_engine.url,
        "/v1/completions",
        {
            "model": smollm_engine.model,
            "prompt": prompt,
            "temperature": 0,
            "max_tokens": 12,
            "stream": True,
            "return_token_ids": True,
            "stream_options": {"include_usage": True},
        },
    )
    chunks, usage = frames[:-1], frames[-1]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == prompt
    assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])
    ids = [i for c in chunks for i in c["choices"][0]["token_ids"]]
    assert ids == whole["choices"][0]["token_ids"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert usage["choices"] == []
    assert usage["usage"] == whole["usage"]


async def test_openai_sdk_completions(smollm_engine: EngineProcess) -> None:
    client = AsyncOpenAI(base_url=smollm_engine.url + "/v1", api_key="unused")
    async with client:
        response = await client.completions.create(
            model=smollm_engine.model,
            prompt="Once upon a time",
            max_tokens=6,
            temperature=0,
            n=2,
            extra_body={"return_token_ids": True},
        )
    assert [c.index for c in response.choices] == [0, 1]
    assert response.choices[0].text == response.choices[1].text  # greedy
    assert response.usage is not None
    assert response.usage.completion_tokens == 12
