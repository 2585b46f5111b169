"""An Anthropic history sent back to the proxy reaches the engine as the engine wrote it, through
the signed reference in the thinking block's `signature`, and only for its own rollout."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest

from rolltap.store import Store
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import fake_engine, new_rollout, running_proxy

BASH = {
    "name": "Bash",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}
# The engine's spelling (double space) and a tool-call id that is not a valid Anthropic id.
ARGS = '{"command":  "echo hi"}'
ENGINE_ID = "functions.Bash:0"


def script(body: dict[str, Any]) -> Reply:
    if body["messages"][-1]["role"] == "tool":
        return Reply(text="done")
    return Reply(
        text="Running it.",
        reasoning="One command will do.",
        tool_calls=[{"name": "Bash", "arguments": ARGS, "id": ENGINE_ID}],
    )


@pytest.fixture
async def clients() -> AsyncIterator[list[anthropic.AsyncAnthropic]]:
    made: list[anthropic.AsyncAnthropic] = []
    try:
        yield made
    finally:
        for client in made:
            await client.close()


def chats(fake: FakeVLLM) -> list[dict[str, Any]]:
    return [body for path, _, body in fake.requests if path == "/v1/chat/completions"]


async def first_turn(client: anthropic.AsyncAnthropic) -> list[dict[str, Any]]:
    async with client.messages.stream(
        model="m",
        max_tokens=500,
        messages=[{"role": "user", "content": "go"}],
        tools=[BASH],  # type: ignore[list-item]
        thinking={"type": "adaptive"},  # type: ignore[typeddict-item]
    ) as events:
        message = await events.get_final_message()
    return [block.model_dump(mode="json", exclude_unset=True) for block in message.content]


def history(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    tool_use = blocks[-1]
    return [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": blocks},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_use["id"], "content": "hi"}],
        },
    ]


async def second_turn(client: anthropic.AsyncAnthropic, blocks: list[dict[str, Any]]) -> None:
    await client.messages.create(
        model="m",
        max_tokens=500,
        messages=history(blocks),  # type: ignore[arg-type]
        tools=[BASH],  # type: ignore[list-item]
    )


async def test_signature_restores_the_engines_turn(
    store: Store, clients: list[anthropic.AsyncAnthropic]
) -> None:
    async with (
        fake_engine(FakeVLLM(script=script)) as engine,
        running_proxy(store, engine.url) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        client = anthropic.AsyncAnthropic(base_url=f"{proxy.url}/r/{key}", api_key="x")
        clients.append(client)
        blocks = await first_turn(client)
        first_call = (await store.calls(rollout_id))[0]
        thinking, _text, tool_use = blocks
        assert thinking["thinking"] == "One command will do."
        # The engine's id is not a valid Anthropic id: the client gets one minted from the call.
        assert tool_use["id"] == f"toolu_{first_call.id}_0"
        assert tool_use["input"] == {"command": "echo hi"}

        await second_turn(client, blocks)

        _, second = chats(engine.fake)
        assert second["messages"][1:] == [
            {
                "role": "assistant",
                "content": "Running it.",
                "reasoning": "One command will do.",
                "tool_calls": [
                    {
                        "id": ENGINE_ID,
                        "type": "function",
                        "function": {"name": "Bash", "arguments": ARGS},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": ENGINE_ID, "content": "hi"},
        ]
        assert (await store.calls(rollout_id))[1].error is None


@pytest.mark.parametrize(
    ("case", "note"),
    [
        ("other rollout", "assistant turn 1: reference not honoured"),
        ("forged", "assistant turn 1: reference not honoured"),
        ("edited", "assistant turn 1 differs from the answer its reference names"),
    ],
)
async def test_a_signature_that_does_not_fit_is_not_honoured(
    store: Store, clients: list[anthropic.AsyncAnthropic], case: str, note: str
) -> None:
    async with (
        fake_engine(FakeVLLM(script=script)) as engine,
        running_proxy(store, engine.url) as proxy,
    ):
        rollout_a, key_a = await new_rollout(store)
        rollout_b, key_b = await new_rollout(store)
        client_a = anthropic.AsyncAnthropic(base_url=f"{proxy.url}/r/{key_a}", api_key="x")
        client_b = anthropic.AsyncAnthropic(base_url=f"{proxy.url}/r/{key_b}", api_key="x")
        clients += [client_a, client_b]
        blocks = await first_turn(client_a)
        target, rollout = client_a, rollout_a
        if case == "other rollout":
            target, rollout = client_b, rollout_b
        elif case == "forged":
            blocks[0]["signature"] = blocks[0]["signature"][:-3] + "xyz"
        else:
            blocks[1]["text"] = "Running something else."

        await second_turn(target, blocks)

        assistant = chats(engine.fake)[1]["messages"][1]
        # What the harness sent: its own JSON for the input, its ids, reasoning as it wrote it.
        call = assistant["tool_calls"][0]
        assert call["function"]["arguments"] == json.dumps({"command": "echo hi"})
        assert call["id"] == blocks[2]["id"]
        assert assistant["reasoning_content"] == "One command will do."
        last = (await store.calls(rollout))[-1]
        assert (last.error or "").startswith(note)
