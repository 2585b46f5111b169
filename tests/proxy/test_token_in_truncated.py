"""Token-in continues an answer cut at its token limit: the next prompt is the previous prompt,
the ids sampled, the template's end of turn (added by rolltap, mask 0, noted on the call) and
the bridge, so a chat at a small `max_tokens` stays one segment.

On the fake engine (vLLM's /v1/completions, SGLang's /generate; the three client dialects,
streamed and whole, a call cut inside its hermes block) and on the real SmolLM2 engine.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import anthropic
import numpy as np
import openai
import pytest

from rolltap.analysis.bridging import Bridging
from rolltap.analysis.reading import rollout_trajectories
from rolltap.engine.launch import EngineProcess
from rolltap.proxy.tokenin.options import TokenInOptions
from rolltap.store import Store
from tests.support.chats import smollm2_tokenizer
from tests.support.fake_vllm import IM_END, IM_START, FakeVLLM, Reply, encode
from tests.support.proxy import OpenAIFactory, fake_engine, new_rollout, running_proxy
from tests.support.streams import add_call_deltas

TOKEN_IN = TokenInOptions(enabled=True)
"""`rolltap serve --token-in`."""
LIMIT = 16
STORY = "Once upon a time a fox and a crow met by the river, and the fox spoke first."
MORE = "Then the crow dropped the cheese, and the fox ran off into the deep wood."
ASKS = ("Tell me a story.", "Go on.", "And then?", "How does it end?")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
LONG_CALL = Reply(text="", tool_calls=[{"name": "bash", "arguments": '{"command": "ls -la /usr"}'}])
"""Written as <tool_call>{"name":"bash","arguments":{"command":"ls -la /usr"}}</tool_call>."""


def fake(sglang: bool = False) -> FakeVLLM:
    """The first turn is rendered on the chat route, every later one is token-in: both write
    far more than LIMIT tokens."""
    return FakeVLLM(
        sglang=sglang,
        script=lambda body: Reply(text=STORY),
        completion_script=lambda prompt: Reply(text=MORE),
    )


def bridge_to(role: str, text: str) -> list[int]:
    """The fake template's bridge after <|im_end|>: a new message and the assistant header."""
    turn = [IM_START, *encode(f"{role}\n{text}"), IM_END, *encode("\n")]
    return [*encode("\n"), *turn, IM_START, *encode("assistant\n")]


async def chat(client: openai.AsyncOpenAI, model: str, stream: bool) -> list[str]:
    """Four turns, each answer cut at LIMIT tokens and sent back as the assistant message."""
    messages: list[dict[str, Any]] = []
    answers: list[str] = []
    for ask in ASKS:
        messages.append({"role": "user", "content": ask})
        params: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "max_tokens": LIMIT,
            "temperature": 0,
        }
        if stream:
            text, finish = "", None
            async for chunk in await client.chat.completions.create(**params, stream=True):
                for choice in chunk.choices:
                    text += choice.delta.content or ""
                    finish = choice.finish_reason or finish
        else:
            reply = await client.chat.completions.create(**params)
            text, finish = reply.choices[0].message.content or "", reply.choices[0].finish_reason
        assert finish == "length", (text, finish)
        messages.append({"role": "assistant", "content": text})
        answers.append(text)
    return answers


async def responses(url: str, stream: bool) -> None:
    items: list[Any] = []
    async with openai.AsyncOpenAI(base_url=url, api_key="x") as client:
        for ask in ASKS:
            items.append({"role": "user", "content": ask})
            params: dict[str, Any] = {"model": "m", "input": items, "max_output_tokens": LIMIT}
            if stream:
                # The SDK's stream helper waits for response.completed; a cut one is incomplete.
                async for event in await client.responses.create(**params, stream=True):
                    if event.type == "response.incomplete":
                        response = event.response
            else:
                response = await client.responses.create(**params)
            assert response.status == "incomplete", response
            items += [item.model_dump(exclude_none=True) for item in response.output]


async def anthropic_messages(url: str, stream: bool) -> None:
    turns: list[dict[str, Any]] = []
    async with anthropic.AsyncAnthropic(base_url=url, api_key="x") as client:
        for ask in ASKS:
            turns.append({"role": "user", "content": ask})
            params: dict[str, Any] = {"model": "m", "max_tokens": LIMIT, "messages": turns}
            if stream:
                async with client.messages.stream(**params) as events:
                    message = await events.get_final_message()
            else:
                message = await client.messages.create(**params)
            assert message.stop_reason == "max_tokens", message
            blocks = [b.model_dump(exclude_none=True) for b in message.content]
            turns.append({"role": "assistant", "content": blocks})


async def one_chain(store: Store, rollout_id: str, end_of_turn: list[int]) -> list[list[int]]:
    """Assert first turn then bridged calls, one segment; each prompt the one before, its
    sampled ids, `end_of_turn` (mask 0, no logprob, noted on the call) and a bridge (mask 0):
    those bridges, in order."""
    calls = await store.calls(rollout_id)
    outcomes = [c.bridge for c in calls]
    assert outcomes == ["first_turn", *["bridged"] * (len(calls) - 1)], outcomes
    bridging = Bridging.of(outcomes)
    assert bridging is not None
    assert bridging.bridge_break_rate == 0.0
    assert [c.finish_reason for c in calls] == ["length"] * len(calls)
    assert calls[0].error is None
    for call in calls[1:]:
        assert call.error is not None
        assert f"end of turn {end_of_turn} added by rolltap" in call.error
    (one,) = (await rollout_trajectories(store, rollout_id)).trajectories
    assert one.call_ids == tuple(c.id for c in calls)
    tokens = [await store.call_tokens(c.id) for c in calls]
    last = tokens[-1]
    assert np.array_equal(
        np.concatenate([one.prompt_ids, one.response_ids]),
        np.concatenate([last.prompt_ids, last.choices[0].token_ids]),
    )
    start = len(one.prompt_ids)
    bridges = []
    for before, after in itertools.pairwise(tokens):
        held = [*before.prompt_ids.tolist(), *before.choices[0].token_ids.tolist()]
        sent = after.prompt_ids.tolist()
        assert sent[: len(held)] == held
        assert sent[len(held) : len(held) + len(end_of_turn)] == end_of_turn
        bridges.append(sent[len(held) + len(end_of_turn) :])
        # The added ids and the bridge are context: mask 0, logprob 0.0.
        assert not one.loss_mask[len(held) - start : len(sent) - start].any()
        assert not one.logprobs[len(held) - start : len(sent) - start].any()
        sampled = len(after.choices[0].token_ids)
        assert one.loss_mask[len(sent) - start : len(sent) - start + sampled].all()
    assert int(one.loss_mask.sum()) == sum(len(t.choices[0].token_ids) for t in tokens)
    return bridges


def completions_prompts(engine: FakeVLLM, path: str, field: str) -> list[list[int]]:
    return [list(body[field]) for p, _, body in engine.requests if p == path]


# -- the fake engine ----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_chat_cut_at_every_turn_is_one_chain(
    store: Store, sdk: OpenAIFactory, stream: bool
) -> None:
    engine = fake()
    async with (
        fake_engine(engine) as served,
        running_proxy(store, served.url, token_in=TOKEN_IN) as proxy,
    ):
        rollout_id, key = await new_rollout(store, task_id="t")
        answers = await chat(sdk(f"{proxy.url}/r/{key}/v1"), "m", stream)

    assert answers == [STORY[:LIMIT], *[MORE[:LIMIT]] * 3]
    bridges = await one_chain(store, rollout_id, [IM_END])
    assert bridges == [bridge_to("user", ask) for ask in ASKS[1:]]
    calls = await store.calls(rollout_id)
    sent = completions_prompts(engine, "/v1/completions", "prompt")
    tokens = [await store.call_tokens(c.id) for c in calls[1:]]
    assert sent == [t.prompt_ids.tolist() for t in tokens]


async def test_the_chat_route_sends_the_same_ids(store: Store, sdk: OpenAIFactory) -> None:
    """`--token-in-route chat`: the chained ids go with the chat request."""
    engine = fake()
    chat_route = TokenInOptions(enabled=True, route="chat")
    async with (
        fake_engine(engine) as served,
        running_proxy(store, served.url, token_in=chat_route) as proxy,
    ):
        rollout_id, key = await new_rollout(store, task_id="t")
        await chat(sdk(f"{proxy.url}/r/{key}/v1"), "m", stream=False)

    bridges = await one_chain(store, rollout_id, [IM_END])
    assert bridges == [bridge_to("user", ask) for ask in ASKS[1:]]
    sent = [
        (body.get("kv_transfer_params") or {}).get("prompt_token_ids")
        for path, _, body in engine.requests
        if path == "/v1/chat/completions"
    ]
    calls = await store.calls(rollout_id)
    tokens = [await store.call_tokens(c.id) for c in calls[1:]]
    assert sent == [None, *[t.prompt_ids.tolist() for t in tokens]]


async def test_normal_mode_still_renders_a_cut_chat(store: Store, sdk: OpenAIFactory) -> None:
    """Without token-in nothing is added: the engine renders every request (its template
    writes <|im_end|> after the cut text itself, so this append-only one is one segment)."""
    engine = fake()
    async with fake_engine(engine) as served, running_proxy(store, served.url) as proxy:
        rollout_id, key = await new_rollout(store, task_id="t")
        await chat(sdk(f"{proxy.url}/r/{key}/v1"), "m", stream=False)

    calls = await store.calls(rollout_id)
    assert [c.bridge for c in calls] == [None] * 4
    assert [c.error for c in calls] == [None] * 4
    assert [p for p, _, _ in engine.requests] == ["/v1/chat/completions"] * 4
    (one,) = (await rollout_trajectories(store, rollout_id)).trajectories
    assert one.link is None


async def test_on_sglang_a_cut_chat_is_one_chain(store: Store, sdk: OpenAIFactory) -> None:
    engine = fake(sglang=True)
    async with (
        fake_engine(engine) as served,
        running_proxy(store, f"sglang={served.url}", token_in=TOKEN_IN) as proxy,
    ):
        rollout_id, key = await new_rollout(store, task_id="t")
        await chat(sdk(f"{proxy.url}/r/{key}/v1"), "m", stream=True)

    bridges = await one_chain(store, rollout_id, [IM_END])
    assert bridges == [bridge_to("user", ask) for ask in ASKS[1:]]
    assert len(completions_prompts(engine, "/generate", "input_ids")) == 3


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("dialect", ["responses", "messages"])
async def test_other_dialects_continue_a_cut_answer(
    store: Store, dialect: str, stream: bool
) -> None:
    async with (
        fake_engine(fake()) as served,
        running_proxy(store, served.url, token_in=TOKEN_IN) as proxy,
    ):
        rollout_id, key = await new_rollout(store, task_id="t")
        if dialect == "responses":
            await responses(f"{proxy.url}/r/{key}/v1", stream)
        else:
            await anthropic_messages(f"{proxy.url}/r/{key}", stream)

    bridges = await one_chain(store, rollout_id, [IM_END])
    assert bridges == [bridge_to("user", ask) for ask in ASKS[1:]]


async def test_a_streamed_call_cut_in_its_block_is_bridged(
    store: Store, sdk: OpenAIFactory
) -> None:
    """The stream opened the call and sent part of its arguments before the limit; the harness
    sends that call back with its tool result, and the chain goes on after <|im_end|>."""
    replies: Iterator[Reply] = iter([LONG_CALL, Reply(text="Done.")])
    engine = FakeVLLM(
        script=lambda body: Reply(text="Sure."),
        completion_script=lambda prompt: next(replies),
    )
    cut = len('<tool_call>{"name":"bash","arguments":{"command":"ls')
    async with (
        fake_engine(engine) as served,
        running_proxy(store, served.url, token_in=TOKEN_IN) as proxy,
    ):
        rollout_id, key = await new_rollout(store, task_id="t")
        client = sdk(f"{proxy.url}/r/{key}/v1")
        messages: list[dict[str, Any]] = [{"role": "user", "content": "What is in /usr?"}]
        first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "Look."},
        ]
        calls: list[dict[str, Any]] = []
        finish = None
        async for chunk in await client.chat.completions.create(
            model="m", messages=messages, tools=TOOLS, max_tokens=cut, stream=True
        ):
            for choice in chunk.choices:
                add_call_deltas(calls, choice.delta.tool_calls or ())
                finish = choice.finish_reason or finish
        assert finish == "length"
        assert [c["function"]["name"] for c in calls] == ["bash"]  # opened before the cut
        arguments = calls[0]["function"]["arguments"]
        assert arguments.startswith('{"command": "ls'), arguments
        assert not arguments.endswith("}"), arguments
        result = "error: the call was cut"
        messages += [
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": result},
        ]
        last = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        assert last.choices[0].message.content == "Done."

    rows = await store.calls(rollout_id)
    assert [c.bridge for c in rows] == ["first_turn", "bridged", "bridged"]
    assert rows[1].error is None  # the first answer ended at its <|im_end|>
    assert rows[2].error is not None
    assert f"end of turn {[IM_END]} added by rolltap" in rows[2].error
    cut_call, after = [await store.call_tokens(c.id) for c in rows[1:]]
    held = [*cut_call.prompt_ids.tolist(), *cut_call.choices[0].token_ids.tolist()]
    assert cut_call.choices[0].token_ids.tolist()[-3:] == encode('"ls')
    assert after.prompt_ids.tolist() == [*held, IM_END, *bridge_to("tool", result)]
    (one,) = (await rollout_trajectories(store, rollout_id)).trajectories
    assert one.call_ids == tuple(c.id for c in rows)
    assert one.loss_mask[len(held) - len(one.prompt_ids)] == 0  # the added <|im_end|>


# -- the real engine ----------------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_on_the_builtin_engine_a_cut_chat_is_one_chain(
    store: Store,
    sdk: OpenAIFactory,
    smollm_engine: EngineProcess,
    stream: bool,
) -> None:
    async with running_proxy(store, smollm_engine.url, token_in=TOKEN_IN) as proxy:
        rollout_id, key = await new_rollout(store, task_id="t")
        await chat(sdk(f"{proxy.url}/r/{key}/v1"), smollm_engine.model, stream)

    tokenizer = smollm2_tokenizer()
    bridges = await one_chain(store, rollout_id, [tokenizer.convert_tokens_to_ids("<|im_end|>")])
    assert [tokenizer.decode(b) for b in bridges] == [
        f"\n<|im_start|>user\n{ask}<|im_end|>\n<|im_start|>assistant\n" for ask in ASKS[1:]
    ]
