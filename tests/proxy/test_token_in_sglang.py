"""Token-in on an SGLang backend: bridged ids go to SGLang's native `/generate` (`input_ids`,
`sampling_params` in SGLang's names), its cumulative stream is read as deltas, and the text is
parsed into the client's chat answer, tool calls and logprobs included."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from rolltap.store import Store
from tests.support.fake_vllm import IM_END, FakeVLLM, Reply, encode, generated, logprob_of
from tests.support.proxy import OpenAIFactory, fake_engine, new_rollout, running_proxy
from tests.support.streams import add_call_deltas

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
CALL = Reply(text="Listing.", tool_calls=[{"name": "bash", "arguments": '{"command": "ls /"}'}])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_token_in_on_sglang_goes_to_generate(
    store: Store, sdk: OpenAIFactory, stream: bool
) -> None:
    fake = FakeVLLM(
        sglang=True,
        script=lambda body: Reply(text="I will look."),
        completion_script=lambda prompt: CALL,
    )
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, f"sglang={engine.url}") as proxy,
    ):
        rollout_id, key = await new_rollout(store, task_id="t", meta={"token_in": True})
        client = sdk(f"{proxy.url}/r/{key}/v1")
        messages: list[Any] = [{"role": "user", "content": "what is in /?"}]
        first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "go on"},
        ]
        params: dict[str, Any] = {
            "model": "m",
            "messages": messages,
            "tools": TOOLS,
            "max_tokens": 500,
            "temperature": 0.5,
            "logprobs": True,
        }
        if stream:
            text, calls, finish, entries = "", [], None, []
            async for chunk in await client.chat.completions.create(**params, stream=True):
                for choice in chunk.choices:
                    text += choice.delta.content or ""
                    add_call_deltas(calls, choice.delta.tool_calls or ())
                    entries += choice.logprobs.content if choice.logprobs else []
                    finish = choice.finish_reason or finish
            got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
        else:
            answer = await client.chat.completions.create(**params)
            message = answer.choices[0].message
            text, finish = message.content or "", answer.choices[0].finish_reason
            got = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]
            entries = answer.choices[0].logprobs.content

    assert (text, got, finish) == ("Listing.", [("bash", {"command": "ls /"})], "tool_calls")
    path, _, sent = fake.requests[-1]
    assert path == "/generate"
    # SGLang's names: max_tokens and seed would be refused.
    assert sent["sampling_params"] == {"max_new_tokens": 500, "temperature": 0.5}
    calls = sorted(await store.calls(rollout_id), key=lambda c: c.seq)
    assert [c.bridge for c in calls] == ["first_turn", "bridged"]
    before, after = [await store.call_tokens(c.id) for c in calls]
    held = [*before.prompt_ids.tolist(), *before.choices[0].token_ids.tolist()]
    assert sent["input_ids"][: len(held)] == held
    assert after.prompt_ids.tolist() == sent["input_ids"]
    sampled = [*encode(generated(CALL, CALL.text)), IM_END]
    assert after.choices[0].token_ids.tolist() == sampled
    expected = [logprob_of(i) for i in sampled]
    assert np.allclose(after.choices[0].logprobs, expected)
    assert [e.logprob for e in entries] == pytest.approx(expected)
