"""Token-in mode removes real drift: the official SDKs, the real proxy, the real SmolLM2.

The engine serves SmolLM2 behind a Qwen3-style template that drops earlier reasoning,
re-serialises tool-call arguments and, like GLM-4.5-style templates, writes an empty
`<think></think>` into every earlier assistant turn. Re-rendering the history therefore never
reproduces what the model sampled: in normal mode every call after the first breaks the
rollout's token chain. In token-in mode the proxy sends the earlier prompt, the sampled ids and
the bridge instead, so the same tool-using conversation, through each dialect, streaming or
not, is one segment whose ids are exactly the engine's.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import numpy as np
import openai
import pytest
import pytest_asyncio

from rolltap.analysis.reading import rollout_trajectories
from rolltap.engine.launch import EngineProcess
from rolltap.proxy.server import RunningProxy
from rolltap.proxy.tokenin.options import TokenInOptions
from rolltap.store import Store
from tests.support.chats import QWEN3_STYLE
from tests.support.proxy import new_rollout, running_proxy
from tests.support.stores import opened_store
from tests.support.streams import add_call_deltas

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

MODEL = "smollm-glm"
CITIES = ("London", "Rome", "Oslo")
COMPACT = '{{"name":"get_weather","arguments":{{"city":"{city}"}}}}'
TEMPLATED = '{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}'
"""A tool call exactly as the template renders one: copying it, the model writes answers the
template re-renders to the same ids."""
APPEND_ONLY = {"chat_template_kwargs": {"empty_think": False, "enable_thinking": False}}
"""No empty think block in the template, and thinking said off: vLLM 0.33's qwen3 parser, which
token-in follows, reads an answer without `</think>` as all reasoning unless thinking is off."""
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a city",
        "parameters": PARAMETERS,
    },
}
RESPONSES_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the weather in a city",
    "parameters": PARAMETERS,
}
MESSAGES_TOOL = {
    "name": "get_weather",
    "description": "Get the weather in a city",
    "input_schema": PARAMETERS,
}


def few_shot(style: str = COMPACT) -> list[dict[str, str]]:
    """Earlier turns in text in which the assistant wrote tool calls in `style`; the model
    copies it. The compact style is one the template re-serialises."""
    turns: list[dict[str, str]] = []
    for city in CITIES:
        turns += [
            {"role": "user", "content": f"What is the weather in {city}?"},
            {
                "role": "assistant",
                "content": f"<tool_call>\n{style.format(city=city)}\n</tool_call>",
            },
            {"role": "user", "content": "sunny"},
            {"role": "assistant", "content": f"It is sunny in {city}."},
        ]
    return [*turns, {"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    template = tmp_path_factory.mktemp("template") / "glm_style.jinja"
    # GLM-style unless a request turns it off (`chat_template_kwargs`): then append-only.
    switch = "{%- if empty_think is not defined %}{%- set empty_think = true %}{%- endif %}"
    template.write_text(switch + QWEN3_STYLE.read_text())
    started = EngineProcess.start(
        extra_args=(
            "--chat-template",
            str(template),
            "--reasoning-parser",
            "think",
            "--served-model-name",
            MODEL,
            "--default-max-tokens",
            "48",
        )
    )
    try:
        yield started
    finally:
        started.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def store(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Store]:
    """One store and one proxy for the module: each test has rollouts of its own."""
    folder = tmp_path_factory.mktemp("store")
    async with opened_store(f"sqlite:///{folder / 'store.sqlite'}") as opened:
        yield opened


@dataclass
class Rollout:
    store: Store
    proxy: RunningProxy
    id: str
    key: str

    @property
    def openai_url(self) -> str:
        return f"{self.proxy.url}/r/{self.key}/v1"

    @property
    def anthropic_url(self) -> str:
        return f"{self.proxy.url}/r/{self.key}"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def proxy(store: Store, engine: EngineProcess) -> AsyncIterator[RunningProxy]:
    async with running_proxy(
        store, engine.url, token_in=TokenInOptions(reasoning_parser="qwen3")
    ) as running:
        yield running


async def rollout(store: Store, proxy: RunningProxy, token_in: bool) -> Rollout:
    rollout_id, key = await new_rollout(store, task_id="t", meta={"token_in": token_in})
    return Rollout(store, proxy, rollout_id, key)


# -- one conversation per dialect: a tool call, its result, an answer, a second question -----


async def chat_conversation(
    r: Rollout, stream: bool, style: str = COMPACT, extra: dict[str, Any] | None = None
) -> list[tuple[str, list[str]]]:
    """(text, tool call arguments) of each answer the client received."""
    seen: list[tuple[str, list[str]]] = []
    messages: list[dict[str, Any]] = list(few_shot(style))
    calls: list[dict[str, Any]] = []
    async with openai.AsyncOpenAI(base_url=r.openai_url, api_key="x") as client:
        for then in ("Paris", "rainy", "Berlin"):
            if then == "rainy":
                messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": then})
            elif then == "Berlin":
                messages.append({"role": "user", "content": "What is the weather in Berlin?"})
            params: dict[str, Any] = {
                "model": MODEL,
                "messages": messages,
                "tools": [CHAT_TOOL],
                "temperature": 0,
                **({"extra_body": extra} if extra else {}),
            }
            if stream:
                text, calls = "", []
                async for chunk in await client.chat.completions.create(**params, stream=True):
                    delta = chunk.choices[0].delta if chunk.choices else None
                    text += (delta.content or "") if delta else ""
                    add_call_deltas(calls, (delta.tool_calls or []) if delta else [])
            else:
                reply = await client.chat.completions.create(**params)
                message = reply.choices[0].message
                text = message.content or ""
                calls = [c.model_dump() for c in message.tool_calls or []]
            messages.append(
                {
                    "role": "assistant",
                    "content": text or None,
                    **({"tool_calls": calls} if calls else {}),
                }
            )
            seen.append((text, [c["function"]["arguments"] for c in calls]))
    return seen


async def responses_conversation(r: Rollout, stream: bool) -> list[tuple[str, list[str]]]:
    seen: list[tuple[str, list[str]]] = []
    items: list[Any] = list(few_shot())
    call_ids: list[str] = []
    async with openai.AsyncOpenAI(base_url=r.openai_url, api_key="x") as client:
        for then in ("Paris", "rainy", "Berlin"):
            if then == "rainy":
                items.append(
                    {"type": "function_call_output", "call_id": call_ids[0], "output": then}
                )
            elif then == "Berlin":
                items.append({"role": "user", "content": "What is the weather in Berlin?"})
            params: dict[str, Any] = {"model": MODEL, "input": items, "tools": [RESPONSES_TOOL]}
            if stream:
                async with client.responses.stream(**params, temperature=0) as events:
                    response = await events.get_final_response()
            else:
                response = await client.responses.create(**params, temperature=0)
            output = [item.model_dump(exclude_none=True) for item in response.output]
            items += output
            call_ids = [o["call_id"] for o in output if o["type"] == "function_call"]
            arguments = [o["arguments"] for o in output if o["type"] == "function_call"]
            seen.append((response.output_text, arguments))
    return seen


async def messages_conversation(r: Rollout, stream: bool) -> list[tuple[str, list[str]]]:
    seen: list[tuple[str, list[str]]] = []
    turns: list[dict[str, Any]] = list(few_shot())
    use_ids: list[str] = []
    async with anthropic.AsyncAnthropic(base_url=r.anthropic_url, api_key="x") as client:
        for then in ("Paris", "rainy", "Berlin"):
            if then == "rainy":
                result = {"type": "tool_result", "tool_use_id": use_ids[0], "content": then}
                turns.append({"role": "user", "content": [result]})
            elif then == "Berlin":
                turns.append({"role": "user", "content": "What is the weather in Berlin?"})
            params: dict[str, Any] = {
                "model": MODEL,
                "max_tokens": 48,
                "messages": turns,
                "tools": [MESSAGES_TOOL],
                "extra_body": {"temperature": 0},
            }
            if stream:
                async with client.messages.stream(**params) as events:
                    message = await events.get_final_message()
            else:
                message = await client.messages.create(**params)
            blocks = [b.model_dump(exclude_none=True) for b in message.content]
            turns.append({"role": "assistant", "content": blocks})
            use_ids = [b["id"] for b in blocks if b["type"] == "tool_use"]
            text = "".join(b["text"] for b in blocks if b["type"] == "text")
            arguments = [json.dumps(b["input"]) for b in blocks if b["type"] == "tool_use"]
            seen.append((text, arguments))
    return seen


CONVERSATIONS = {
    "chat": chat_conversation,
    "responses": responses_conversation,
    "messages": messages_conversation,
}


async def segments(r: Rollout) -> list[tuple[str, ...]]:
    built = await rollout_trajectories(r.store, r.id)
    return [t.call_ids for t in built.trajectories]


async def test_normal_mode_breaks_at_every_turn(store: Store, proxy: RunningProxy) -> None:
    r = await rollout(store, proxy, token_in=False)
    seen = await chat_conversation(r, stream=False)
    assert seen[0][1]  # two tool turns
    assert seen[2][1]
    calls = [c.id for c in await store.calls(r.id)]
    assert await segments(r) == [(c,) for c in calls]
    assert [c.bridge for c in await store.calls(r.id)] == [None, None, None]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("dialect", sorted(CONVERSATIONS))
async def test_token_in_keeps_one_segment_of_the_engines_ids(
    store: Store, proxy: RunningProxy, dialect: str, stream: bool
) -> None:
    r = await rollout(store, proxy, token_in=True)
    seen = await CONVERSATIONS[dialect](r, stream)

    assert seen[0][1], seen  # the model called the tool twice
    assert seen[2][1], seen
    calls = await store.calls(r.id)
    assert [c.bridge for c in calls] == ["first_turn", "bridged", "bridged"]
    (one,) = (await rollout_trajectories(r.store, r.id)).trajectories
    assert one.call_ids == tuple(c.id for c in calls)
    last = await store.call_tokens(calls[-1].id)
    engine_ids = np.concatenate([last.prompt_ids, last.choices[0].token_ids])
    assert np.array_equal(np.concatenate([one.prompt_ids, one.response_ids]), engine_ids)
    for before, after in itertools.pairwise(calls):
        # Each prompt repeats the one before and everything the engine sampled for it.
        b, a = await store.call_tokens(before.id), await store.call_tokens(after.id)
        held = np.concatenate([b.prompt_ids, b.choices[0].token_ids])
        assert np.array_equal(a.prompt_ids[: len(held)], held)


async def test_append_only_template_gives_the_same_answers_either_way(
    store: Store, proxy: RunningProxy
) -> None:
    """Where the template re-renders every answer to the ids sampled, token-in changes nothing
    the client sees: greedy decoding, the same conversation, the same text and tool calls
    (token-in whole and streamed, against normal mode's whole answers)."""

    async def converse(token_in: bool, stream: bool) -> tuple[list[Any], list[Any]]:
        r = await rollout(store, proxy, token_in=token_in)
        seen = await chat_conversation(r, stream, style=TEMPLATED, extra=APPEND_ONLY)
        return seen, await store.calls(r.id)

    normal, normal_calls = await converse(token_in=False, stream=False)
    assert normal[0][1], normal  # the model called the tool twice
    assert normal[2][1], normal
    for stream in (False, True):
        seen, calls = await converse(token_in=True, stream=stream)
        assert seen == normal, stream
        assert [c.bridge for c in calls] == ["first_turn", "bridged", "bridged"]
        for rendered, bridged in zip(normal_calls, calls, strict=True):
            # The engine saw the same ids: the bridge is exactly what the template adds.
            a, b = await store.call_tokens(rendered.id), await store.call_tokens(bridged.id)
            assert np.array_equal(a.prompt_ids, b.prompt_ids)
            assert np.array_equal(a.choices[0].token_ids, b.choices[0].token_ids)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def chat_route_proxy(store: Store, engine: EngineProcess) -> AsyncIterator[RunningProxy]:
    """`--token-in-route chat`: the ids go with the chat request; the engine parses."""
    async with running_proxy(store, engine.url, token_in=TokenInOptions(route="chat")) as running:
        yield running


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_the_chat_route_keeps_one_segment_parsed_by_the_engine(
    store: Store, chat_route_proxy: RunningProxy, stream: bool
) -> None:
    """The same drifting template, the engine's own tool and reasoning parsers: the ids sent
    with the chat request are sampled from, and the rollout is one segment of them."""
    r = await rollout(store, chat_route_proxy, token_in=True)
    seen = await chat_conversation(r, stream)

    assert seen[0][1], seen  # the engine's parser found the calls
    assert seen[2][1], seen
    calls = await store.calls(r.id)
    assert [c.bridge for c in calls] == ["first_turn", "bridged", "bridged"]
    (one,) = (await rollout_trajectories(r.store, r.id)).trajectories
    assert one.call_ids == tuple(c.id for c in calls)
    for before, after in itertools.pairwise(calls):
        b, a = await store.call_tokens(before.id), await store.call_tokens(after.id)
        held = np.concatenate([b.prompt_ids, b.choices[0].token_ids])
        assert np.array_equal(a.prompt_ids[: len(held)], held)
