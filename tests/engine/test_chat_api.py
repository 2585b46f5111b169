"""/v1/chat/completions against the real SmolLM2 engine, in vLLM's dialect."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import pytest_asyncio
import torch
from openai import AsyncOpenAI, AsyncStream

from rolltap.engine.launch import EngineProcess
from tests.support.engine import post_json, post_sse

pytestmark = pytest.mark.model

QUESTION = [{"role": "user", "content": "What is 2+2?"}]
STORY = [{"role": "user", "content": "Tell me a story about a cat."}]
EOS = 2  # <|im_end|>


async def chat(engine: EngineProcess, **fields: Any) -> dict[str, Any]:
    body = {"model": engine.model, "messages": QUESTION, "temperature": 0, **fields}
    status, answer = await post_json(engine.url, "/v1/chat/completions", body)
    assert status == 200, answer
    return answer  # type: ignore[no-any-return]


def recompute_logprobs(
    model: Any, prompt: list[int], output: list[int], temperature: float = 0.0, top_k: int = 0
) -> list[float]:
    """Logprobs of `output` by one plain forward pass over prompt + output (test-side)."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(output)]
    if temperature:
        rows = rows / temperature
    if top_k:
        kth = torch.topk(rows, top_k, dim=-1).values[:, -1:]
        rows = rows.masked_fill(rows < kth, float("-inf"))
    logprobs = torch.log_softmax(rows, dim=-1)
    return logprobs[torch.arange(len(output)), torch.tensor(output)].tolist()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def baseline(smollm_engine: EngineProcess) -> dict[str, Any]:
    """One greedy answer with every id and logprob option on, shared by the tests below."""
    return await chat(
        smollm_engine, return_token_ids=True, logprobs=True, top_logprobs=3, max_tokens=40
    )


async def test_greedy_is_deterministic_and_ids_decode_to_the_text(
    smollm_engine: EngineProcess, baseline: dict[str, Any], tokenizer: Any
) -> None:
    again = await chat(smollm_engine, return_token_ids=True, max_tokens=40)
    choice = baseline["choices"][0]
    assert choice["token_ids"] == again["choices"][0]["token_ids"]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] is None
    assert choice["token_ids"][-1] == EOS
    decoded = tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    assert choice["message"]["content"] == decoded
    assert "4" in decoded
    usage = baseline["usage"]
    assert usage["completion_tokens"] == len(choice["token_ids"])
    assert usage["prompt_tokens"] == len(baseline["prompt_token_ids"])
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert baseline["object"] == "chat.completion"
    assert baseline["model"] == smollm_engine.model


async def test_prompt_ids_are_the_templated_messages(
    smollm_engine: EngineProcess, baseline: dict[str, Any], tokenizer: Any
) -> None:
    status, tokenized = await post_json(
        smollm_engine.url,
        "/tokenize",
        {"model": smollm_engine.model, "messages": QUESTION, "add_generation_prompt": True},
    )
    assert status == 200
    assert tokenized["tokens"] == baseline["prompt_token_ids"]
    assert tokenized["count"] == len(tokenized["tokens"])
    assert tokenized["max_model_len"] == 8192
    expected = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert (
        baseline["prompt_token_ids"] == tokenizer(expected, add_special_tokens=False)["input_ids"]
    )


async def test_greedy_logprobs_match_a_forward_pass(
    baseline: dict[str, Any], reference_model: Any
) -> None:
    choice = baseline["choices"][0]
    ids = choice["token_ids"]
    entries = choice["logprobs"]["content"]
    assert len(entries) == len(ids)
    got = [e["logprob"] for e in entries]
    assert all(math.isfinite(lp) and lp <= 0 for lp in got)
    expected = recompute_logprobs(reference_model, baseline["prompt_token_ids"], ids)
    assert got == pytest.approx(expected, abs=1e-3)
    for entry in entries:
        # greedy: the sampled token is the most likely one
        assert len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["logprob"] == entry["logprob"]
        assert entry["top_logprobs"][0]["token"] == entry["token"]
        assert bytes(entry["bytes"]).decode() == entry["token"]


async def test_sampled_logprobs_are_of_the_processed_distribution(
    smollm_engine: EngineProcess, reference_model: Any
) -> None:
    answer = await chat(
        smollm_engine,
        messages=STORY,
        temperature=0.7,
        top_k=20,
        seed=11,
        return_token_ids=True,
        logprobs=True,
        max_tokens=12,
    )
    choice = answer["choices"][0]
    got = [e["logprob"] for e in choice["logprobs"]["content"]]
    assert all(math.isfinite(lp) and lp <= 0 for lp in got)
    expected = recompute_logprobs(
        reference_model, answer["prompt_token_ids"], choice["token_ids"], 0.7, 20
    )
    assert got == pytest.approx(expected, abs=1e-3)


async def test_return_tokens_as_token_ids(smollm_engine: EngineProcess) -> None:
    answer = await chat(
        smollm_engine,
        return_token_ids=True,
        logprobs=True,
        return_tokens_as_token_ids=True,
        max_tokens=5,
    )
    choice = answer["choices"][0]
    tokens = [e["token"] for e in choice["logprobs"]["content"]]
    assert tokens == [f"token_id:{i}" for i in choice["token_ids"]]


async def test_max_tokens_ends_with_length(smollm_engine: EngineProcess) -> None:
    for field in ("max_tokens", "max_completion_tokens"):
        answer = await chat(smollm_engine, return_token_ids=True, messages=STORY, **{field: 3})
        choice = answer["choices"][0]
        assert choice["finish_reason"] == "length"
        assert len(choice["token_ids"]) == 3


async def test_stop_string_truncates_text_but_keeps_every_sampled_id(
    smollm_engine: EngineProcess, baseline: dict[str, Any], tokenizer: Any
) -> None:
    full = baseline["choices"][0]
    text = full["message"]["content"]
    stop = "classic"
    assert stop in text
    answer = await chat(smollm_engine, return_token_ids=True, max_tokens=40, stop=[stop, "zzz"])
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == stop
    assert choice["message"]["content"] == text[: text.index(stop)]
    ids = choice["token_ids"]
    assert ids == full["token_ids"][: len(ids)]
    assert stop in tokenizer.decode(ids)  # the id completing the stop string is kept
    assert stop not in tokenizer.decode(ids[:-1])


async def test_include_stop_str_in_output(smollm_engine: EngineProcess) -> None:
    answer = await chat(
        smollm_engine, max_tokens=40, stop="classic", include_stop_str_in_output=True
    )
    assert answer["choices"][0]["message"]["content"].endswith("classic")


async def test_stop_token_ids(smollm_engine: EngineProcess, baseline: dict[str, Any]) -> None:
    full = baseline["choices"][0]
    stop_id = full["token_ids"][3]
    answer = await chat(
        smollm_engine, return_token_ids=True, max_tokens=40, stop_token_ids=[stop_id]
    )
    choice = answer["choices"][0]
    assert choice["token_ids"] == full["token_ids"][:4]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop_id)


async def test_streamed_ids_concatenate_to_the_non_streamed_ones(
    smollm_engine: EngineProcess, baseline: dict[str, Any]
) -> None:
    fields = {"return_token_ids": True, "logprobs": True, "top_logprobs": 3, "max_tokens": 40}
    whole = baseline
    body = {
        "model": smollm_engine.model,
        "messages": QUESTION,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **fields,
    }
    frames = await post_sse(smollm_engine.url, "/v1/chat/completions", body)
    first, chunks, usage = frames[0], frames[1:-1], frames[-1]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["prompt_token_ids"] == whole["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in chunks)
    assert len({f["id"] for f in frames}) == 1
    ids = [i for c in chunks for i in c["choices"][0]["token_ids"]]
    choice = whole["choices"][0]
    assert ids == choice["token_ids"]
    assert len(chunks) == len(ids)  # one chunk per sampled token, EOS included
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == choice["message"]["content"]
    logprobs = [e for c in chunks for e in c["choices"][0]["logprobs"]["content"]]
    assert [e["logprob"] for e in logprobs] == [e["logprob"] for e in choice["logprobs"]["content"]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert usage["choices"] == []
    assert usage["usage"] == whole["usage"]


async def test_n_choices_with_a_seed_are_reproducible(smollm_engine: EngineProcess) -> None:
    fields = {"messages": STORY, "temperature": 1.0, "seed": 5, "max_tokens": 6}
    three = await chat(smollm_engine, n=3, return_token_ids=True, **fields)
    again = await chat(smollm_engine, n=3, return_token_ids=True, **fields)
    one = await chat(smollm_engine, n=1, return_token_ids=True, **fields)
    assert [c["index"] for c in three["choices"]] == [0, 1, 2]
    ids = [c["token_ids"] for c in three["choices"]]
    assert ids == [c["token_ids"] for c in again["choices"]]
    assert ids[0] == one["choices"][0]["token_ids"]
    assert len({tuple(i) for i in ids}) > 1
    assert three["usage"]["completion_tokens"] == sum(len(i) for i in ids)


async def test_streamed_n_choices_each_get_their_ids(smollm_engine: EngineProcess) -> None:
    body = {
        "model": smollm_engine.model,
        "messages": STORY,
        "seed": 3,
        "n": 2,
        "max_tokens": 5,
        "stream": True,
        "return_token_ids": True,
    }
    frames = await post_sse(smollm_engine.url, "/v1/chat/completions", body)
    whole = await chat(
        smollm_engine, **{k: v for k, v in body.items() if k != "stream"}, temperature=1
    )
    for index in (0, 1):
        parts = [f["choices"][0] for f in frames if f["choices"][0]["index"] == index]
        ids = [i for p in parts for i in p.get("token_ids", [])]
        assert ids == whole["choices"][index]["token_ids"]


async def test_request_id_header_names_the_completion(smollm_engine: EngineProcess) -> None:
    body = {"model": smollm_engine.model, "messages": QUESTION, "max_tokens": 1}
    headers = {"X-Request-Id": "rollout-7-turn-2", "X-Session-ID": "rollout-7"}
    status, answer = await post_json(smollm_engine.url, "/v1/chat/completions", body, headers)
    assert status == 200
    assert answer["id"] == "chatcmpl-rollout-7-turn-2"
    status, answer = await post_json(
        smollm_engine.url,
        "/v1/chat/completions",
        {**body, "request_id": "from-body", "session_id": "s"},
    )
    assert answer["id"] == "chatcmpl-from-body"


async def test_openai_sdk_sees_a_normal_completion(smollm_engine: EngineProcess) -> None:
    client = AsyncOpenAI(base_url=smollm_engine.url + "/v1", api_key="unused")
    async with client:
        response = await client.chat.completions.create(
            model=smollm_engine.model,
            messages=[{"role": "user", "content": "What is 2+2?"}],
            temperature=0,
            max_tokens=40,
            logprobs=True,
            extra_body={"return_token_ids": True},
        )
        choice = response.choices[0]
        assert choice.finish_reason == "stop"
        assert choice.message.content
        assert "4" in choice.message.content
        assert choice.logprobs is not None
        assert choice.logprobs.content
        token_ids = choice.model_extra["token_ids"] if choice.model_extra else None
        assert token_ids
        assert len(token_ids) == len(choice.logprobs.content)

        stream = await client.chat.completions.create(
            model=smollm_engine.model,
            messages=[{"role": "user", "content": "What is 2+2?"}],
            temperature=0,
            max_tokens=40,
            stream=True,
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == choice.message.content


def weather_conversation() -> list[dict[str, Any]]:
    """A few-shot history that makes SmolLM2 answer the last question with a tool call."""
    messages: list[dict[str, Any]] = []
    for i, city in enumerate(["London", "Tokyo", "Rome"]):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
        }
        messages += [
            {"role": "user", "content": f"What is the weather in {city}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": "sunny"},
            {"role": "assistant", "content": f"It is sunny in {city}."},
        ]
    return [*messages, {"role": "user", "content": "What is the weather in Paris?"}]


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


async def test_tool_calls_are_parsed_from_the_output(
    smollm_engine: EngineProcess, tokenizer: Any
) -> None:
    answer = await chat(
        smollm_engine,
        messages=weather_conversation(),
        tools=[WEATHER_TOOL],
        return_token_ids=True,
        max_tokens=60,
    )
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_")
    assert call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    raw = tokenizer.decode(choice["token_ids"])
    assert "<tool_call>" in raw  # ids are never altered by parsing
    assert choice["token_ids"][-1] == EOS


async def test_tool_calls_stream_in_the_openai_shape(smollm_engine: EngineProcess) -> None:
    client = AsyncOpenAI(base_url=smollm_engine.url + "/v1", api_key="unused")
    async with client:
        stream = await client.chat.completions.create(
            model=smollm_engine.model,
            messages=weather_conversation(),  # type: ignore[arg-type]
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
            temperature=0,
            max_tokens=60,
            stream=True,
        )
        calls: dict[int, dict[str, str]] = {}
        finish = None
        assert isinstance(stream, AsyncStream)
        async for chunk in stream:
            delta = chunk.choices[0].delta
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += call.id or ""
                if call.function:
                    entry["name"] += call.function.name or ""
                    entry["arguments"] += call.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert list(calls) == [0]
    assert calls[0]["name"] == "get_weather"
    assert calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}


async def test_tool_choice_none_leaves_the_text_alone(smollm_engine: EngineProcess) -> None:
    answer = await chat(
        smollm_engine,
        messages=weather_conversation(),
        tools=[WEATHER_TOOL],
        tool_choice="none",
        max_tokens=60,
    )
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["tool_calls"] == []
    assert "<tool_call>" in choice["message"]["content"]


async def test_token_in_through_kv_transfer_params(
    smollm_engine: EngineProcess, baseline: dict[str, Any]
) -> None:
    templated = baseline
    token_in = await chat(
        smollm_engine,
        messages=[{"role": "user", "content": "ignored when prompt ids are given"}],
        kv_transfer_params={"prompt_token_ids": templated["prompt_token_ids"]},
        return_token_ids=True,
        max_tokens=40,
    )
    assert token_in["prompt_token_ids"] == templated["prompt_token_ids"]
    assert token_in["choices"][0]["token_ids"] == templated["choices"][0]["token_ids"]
