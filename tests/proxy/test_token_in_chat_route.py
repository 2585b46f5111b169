"""`--token-in-route chat`: bridged prompt ids go with the chat request (vLLM's
`kv_transfer_params.prompt_token_ids`, SGLang's `input_ids`), so the engine's own parsers read
the answer; an engine that ignores the ids and renders the messages is caught and recorded.

The fake engine speaks both dialects: its chat route samples from the ids it is given (or, as
an older engine, ignores them), and answers tool calls already parsed, as an engine does."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from rolltap.analysis import outcomes as outcome_counts
from rolltap.analysis.reading import rollout_trajectories
from rolltap.proxy.tokenin.options import TokenInOptions
from rolltap.store import Store
from tests.support.fake_vllm import IM_END, FakeVLLM, Reply, encode, generated, render
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
CHAT = TokenInOptions(enabled=True, route="chat")


def _script(body: dict[str, Any]) -> Reply:
    """A tool call for each of the first two turns, then an answer."""
    results = [m for m in body["messages"] if m.get("role") == "tool"]
    if len(results) < 2:
        command = json.dumps({"command": f"ls /{len(results)}"})
        return Reply(text="", tool_calls=[{"name": "bash", "arguments": command}])
    return Reply(text="two listings")


async def _converse(
    client: Any, stream: bool
) -> tuple[list[dict[str, Any]], list[tuple[str, list[dict[str, Any]]]]]:
    """Three turns; (the messages sent, what each answer said: its text and calls)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "list / twice"}]
    seen = []
    for turn in range(3):
        params = {"model": "m", "messages": messages, "tools": TOOLS}
        if stream:
            text, calls = "", []
            async for chunk in await client.chat.completions.create(**params, stream=True):
                for choice in chunk.choices:
                    text += choice.delta.content or ""
                    add_call_deltas(calls, choice.delta.tool_calls or ())
        else:
            answer = await client.chat.completions.create(**params)
            message = answer.choices[0].message
            text = message.content or ""
            calls = [c.model_dump() for c in message.tool_calls or ()]
        seen.append((text, calls))
        messages.append(
            {
                "role": "assistant",
                "content": text or None,
                **({"tool_calls": calls} if calls else {}),
            }
        )
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"t{turn}"})
    return messages, seen


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("engine_kind", ["vllm", "sglang"])
async def test_bridged_ids_go_with_the_chat_request(
    store: Store, sdk: OpenAIFactory, engine_kind: str, stream: bool
) -> None:
    sglang = engine_kind == "sglang"
    fake = FakeVLLM(script=_script, sglang=sglang)
    async with fake_engine(fake) as engine:
        backend = f"sglang={engine.url}" if sglang else engine.url
        async with running_proxy(store, backend, token_in=CHAT) as proxy:
            rollout_id, key = await new_rollout(store, task_id="t")
            _, seen = await _converse(sdk(f"{proxy.url}/r/{key}/v1"), stream)

    # The engine's parsed answers reach the client as the engine gave them.
    assert [[json.loads(c["function"]["arguments"]) for c in calls] for _, calls in seen] == [
        [{"command": "ls /0"}],
        [{"command": "ls /1"}],
        [],
    ]
    assert seen[2][0] == "two listings"
    chats = [body for path, _, body in fake.requests if path == "/v1/chat/completions"]
    assert not [path for path, _, _ in fake.requests if path in ("/v1/completions", "/generate")]
    calls = sorted(await store.calls(rollout_id), key=lambda c: c.seq)
    assert [c.bridge for c in calls] == ["first_turn", "bridged", "bridged"]
    tokens = [await store.call_tokens(c.id) for c in calls]
    for k in (1, 2):
        sent = (
            chats[k]["input_ids"] if sglang else chats[k]["kv_transfer_params"]["prompt_token_ids"]
        )
        before = tokens[k - 1]
        # The previous prompt, every id it sampled, then the bridge; and sampled from.
        held = [*before.prompt_ids.tolist(), *before.choices[0].token_ids.tolist()]
        assert sent[: len(held)] == held
        assert len(sent) > len(held)
        assert tokens[k].prompt_ids.tolist() == sent
        # The engine's template would have re-spelled the call: a re-render is not the ids.
        assert sent != render(chats[k]["messages"], TOOLS)
    assert "input_ids" not in chats[0]
    assert "kv_transfer_params" not in chats[0]
    first_answer = [*encode(generated(_script(chats[0]), "")), IM_END]
    assert tokens[0].choices[0].token_ids.tolist() == first_answer
    status = (await rollout_trajectories(store, rollout_id)).trajectories
    assert len(status) == 1  # one segment: the conversation never broke


async def test_an_engine_that_ignores_the_ids_is_recorded_as_a_break(
    store: Store, sdk: OpenAIFactory
) -> None:
    fake = FakeVLLM(script=_script, takes_prompt_ids=False)
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, engine.url, token_in=CHAT) as proxy,
    ):
        rollout_id, key = await new_rollout(store, task_id="t")
        await _converse(sdk(f"{proxy.url}/r/{key}/v1"), stream=False)
        async with aiohttp.ClientSession() as http, http.get(f"{proxy.url}/metrics") as resp:
            metrics = await resp.text()

    calls = sorted(await store.calls(rollout_id), key=lambda c: c.seq)
    assert [c.bridge for c in calls] == ["first_turn", "engine_rendered", "engine_rendered"]
    shown = await outcome_counts.bridging(store, rollout_id=rollout_id)
    assert shown is not None
    assert shown.bridge_break_rate == 1.0
    assert 'rolltap_token_in_calls_total{outcome="engine_rendered"} 2.0' in metrics
    assert 'outcome="bridged"' not in metrics
