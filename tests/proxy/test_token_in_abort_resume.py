"""A token-in answer aborted for a weight update is continued, and parsed, as one answer.

The abort lands inside a tool call, with the reasoning before it already streamed. The proxy
records the partial answer (old version), continues it on the same token-in route with the
partial ids appended (new version, linked), and reads both parts with one parser: the client
gets the reasoning once, one whole tool call and finish_reason tool_calls, never the call's text
as content. The conversation's next call still bridges (its prompt is both parts' ids)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from rolltap.analysis.reading import rollout_trajectories
from rolltap.analysis.steps import TurnKind
from rolltap.audit.integrity import verify_rollout
from rolltap.proxy.tokenin.options import TokenInOptions
from rolltap.store import CallStatus, Store
from tests.support.fake_vllm import FakeVLLM, Reply, decode, encode, generated
from tests.support.proxy import OpenAIFactory, fake_engine, new_rollout, running_proxy
from tests.support.streams import add_call_deltas
from tests.support.waiting import until

COMMAND = "echo the quick brown fox jumps over the lazy dog && ls -la /tmp"
ANSWER = Reply(
    text="",
    reasoning="list it",
    tool_calls=[{"name": "bash", "arguments": json.dumps({"command": COMMAND})}],
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
QWEN3 = TokenInOptions(reasoning_parser="qwen3")
CUT_AT = 40
"""Tokens sampled before the update begins: past `<think>list it</think><tool_call>` (36)."""


async def _post(session: aiohttp.ClientSession, url: str, body: Any) -> None:
    async with session.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_token_in_tool_call_cut_by_an_update_reaches_the_client_whole(
    store: Store, sdk: OpenAIFactory, stream: bool
) -> None:
    fake = FakeVLLM(
        script=lambda body: Reply(text="I will look."),
        completion_script=lambda prompt: ANSWER,
        token_delay=0.01,
    )
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, engine.url, weight_version="1", token_in=QWEN3) as proxy,
    ):
        rollout_id, key = await new_rollout(store, task_id="t", meta={"token_in": True})
        client = sdk(f"{proxy.url}/r/{key}/v1", max_retries=0)
        messages: list[Any] = [{"role": "user", "content": "what is in /tmp?"}]
        first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "go on"},
        ]

        async def ask() -> tuple[str, str, list[tuple[str, str]], str | None]:
            if not stream:
                answer = await client.chat.completions.create(
                    model="m", messages=messages, tools=TOOLS
                )
                message = answer.choices[0].message
                calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]
                reasoning = str(getattr(message, "reasoning", None) or "")
                return message.content or "", reasoning, calls, answer.choices[0].finish_reason
            content, reasoning, finishes = "", "", []
            opened: list[dict[str, Any]] = []
            chunks = await client.chat.completions.create(
                model="m", messages=messages, tools=TOOLS, stream=True
            )
            async for chunk in chunks:
                for choice in chunk.choices:
                    content += choice.delta.content or ""
                    reasoning += str(getattr(choice.delta, "reasoning", None) or "")
                    add_call_deltas(opened, choice.delta.tool_calls or ())
                    if choice.finish_reason:
                        finishes.append(choice.finish_reason)
            assert len(finishes) == 1
            calls = [(c["function"]["name"], c["function"]["arguments"]) for c in opened]
            return content, reasoning, calls, finishes[0]

        asking = asyncio.create_task(ask())
        await until(lambda: fake.completion_sampled >= CUT_AT)
        async with aiohttp.ClientSession() as session:
            await _post(session, f"{proxy.url}/v1/weights/begin", {"mode": "abort_resume"})
            await _post(session, f"{proxy.url}/v1/weights/commit", {"version": "2"})
        content, reasoning, calls, finish = await asking

        # The client saw one answer: reasoning once, the call whole, no call text as content.
        assert content == ""
        assert reasoning == "list it"
        assert [(name, json.loads(arguments)) for name, arguments in calls] == [
            ("bash", {"command": COMMAND})
        ]
        assert finish == "tool_calls"

        # The next call of the conversation bridges from both parts' ids.
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": calls[0][1]},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
        ]
        await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)

    calls_made = sorted(await store.calls(rollout_id), key=lambda c: c.seq)
    assert [c.bridge for c in calls_made] == ["first_turn", "bridged", "bridged", "bridged"]
    _, part, rest, after = calls_made
    assert (part.weight_version, part.finish_reason) == ("1", "abort")
    assert (rest.weight_version, rest.finish_reason, rest.resumes) == ("2", "tool_calls", part.id)
    assert rest.status is CallStatus.OK
    assert part.status is CallStatus.OK
    assert (await verify_rollout(store, rollout_id)).issues == ()
    one, two, three = [await store.call_tokens(c.id) for c in (part, rest, after)]
    partial = list(one.choices[0].token_ids)
    # Cut inside the tool call: its opening sampled before the abort, its end after.
    assert "<tool_call>" in decode(partial)
    assert "</tool_call>" not in decode(partial)
    assert list(two.prompt_ids) == list(one.prompt_ids) + partial
    whole = [*encode(generated(ANSWER, "")), 2]
    assert partial + list(two.choices[0].token_ids) == whole
    # Bridged: the prompt after it holds the prompt, both parts and the bridge.
    assert list(three.prompt_ids)[: len(one.prompt_ids) + len(whole)] == [
        *one.prompt_ids,
        *whole,
    ]
    (trajectory,) = (await rollout_trajectories(store, rollout_id)).trajectories
    answers = [(t.kind, t.weight_version) for t in trajectory.turns if t.kind is TurnKind.ANSWER]
    assert answers == [
        (TurnKind.ANSWER, "1"),
        (TurnKind.ANSWER, "1"),
        (TurnKind.ANSWER, "2"),
        (TurnKind.ANSWER, "2"),
    ]
