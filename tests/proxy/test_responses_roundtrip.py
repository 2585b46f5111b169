"""A Responses history sent back to the proxy reaches the engine as the engine wrote it: reasoning
and tool-call arguments exactly, through the signed reference in `encrypted_content`, and only
for the rollout that reference was minted for. Also the references and their secret themselves.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import openai
import pytest

from rolltap.proxy.handles import Handle, HandleCheck, Handles
from rolltap.proxy.secret import secret_path, signing_key
from rolltap.store import Store, resolve_url
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import OpenAIFactory, fake_engine, new_rollout, running_proxy
from tests.support.stores import opened_store

SHELL = {
    "type": "function",
    "name": "shell",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files."}
# The engine's own spelling: odd spacing and an escaped non-ASCII character, which a client's
# re-serialization of the same value would not reproduce.
SHELL_ARGS = '{"cmd":   "echo caf\\u00e9"}'
PATCH_ARGS = '{"input":"*** Begin Patch\\n*** End Patch"}'


def script(body: dict[str, Any]) -> Reply:
    if body["messages"][-1]["role"] == "tool":
        return Reply(text="done")
    return Reply(
        text="",
        reasoning="Two tools, then stop.",
        tool_calls=[
            {"name": "shell", "arguments": SHELL_ARGS},
            {"name": "apply_patch", "arguments": PATCH_ARGS},
        ],
    )


def chats(fake: FakeVLLM) -> list[dict[str, Any]]:
    return [body for path, _, body in fake.requests if path == "/v1/chat/completions"]


async def first_turn(client: openai.AsyncOpenAI) -> list[dict[str, Any]]:
    response = await client.responses.create(
        model="m", input="go", tools=[SHELL, APPLY_PATCH], include=["reasoning.encrypted_content"]
    )
    return [item.model_dump(exclude_none=True) for item in response.output]


def rewritten(items: list[dict[str, Any]], token: str | None = None) -> list[dict[str, Any]]:
    """The items as a harness might send them back: reasoning text dropped (only the opaque
    reference kept), arguments re-serialized, server-side ids gone."""
    out: list[dict[str, Any]] = []
    for item in items:
        item = {k: v for k, v in item.items() if k not in ("id", "status")}
        if item["type"] == "reasoning":
            item["content"] = []
            if token is not None:
                item["encrypted_content"] = token
        if item["type"] == "function_call":
            item["arguments"] = '{"cmd": "echo café"}'
        out.append(item)
    return out


def second_input(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    outputs = [
        {"type": f"{i['type']}_output", "call_id": i["call_id"], "output": "ok"}
        for i in items
        if i["type"] in ("function_call", "custom_tool_call")
    ]
    return [{"role": "user", "content": "go"}, *items, *outputs]


async def test_history_reaches_the_engine_as_the_engine_wrote_it(
    store: Store, sdk: OpenAIFactory
) -> None:
    async with (
        fake_engine(FakeVLLM(script=script)) as engine,
        running_proxy(store, engine.url) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")
        items = await first_turn(client)
        assert [i["type"] for i in items] == ["reasoning", "function_call", "custom_tool_call"]
        assert items[2]["input"] == "*** Begin Patch\n*** End Patch"

        await client.responses.create(
            model="m", input=second_input(rewritten(items)), tools=[SHELL, APPLY_PATCH]
        )

        _first, second = chats(engine.fake)
        first_call = (await store.calls(rollout_id))[0]
        assistant = second["messages"][1]
        assert assistant == {
            "role": "assistant",
            "content": None,
            "reasoning": "Two tools, then stop.",
            "tool_calls": [
                {
                    "id": f"call_{first_call.id}_0_0",
                    "type": "function",
                    "function": {"name": "shell", "arguments": SHELL_ARGS},
                },
                {
                    "id": f"call_{first_call.id}_0_1",
                    "type": "function",
                    "function": {"name": "apply_patch", "arguments": PATCH_ARGS},
                },
            ],
        }
        assert [m.get("tool_call_id") for m in second["messages"][2:]] == [
            f"call_{first_call.id}_0_0",
            f"call_{first_call.id}_0_1",
        ]
        second_call = (await store.calls(rollout_id))[1]
        assert second_call.error is None


async def test_a_reference_from_another_rollout_or_forged_is_not_honoured(
    store: Store, sdk: OpenAIFactory
) -> None:
    async with (
        fake_engine(FakeVLLM(script=script)) as engine,
        running_proxy(store, engine.url) as proxy,
    ):
        _, key_a = await new_rollout(store)
        rollout_b, key_b = await new_rollout(store)
        items = await first_turn(sdk(f"{proxy.url}/r/{key_a}/v1"))
        token = items[0]["encrypted_content"]
        forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
        client_b = sdk(f"{proxy.url}/r/{key_b}/v1")

        for sent in (token, forged, "gAAAAABo-openai-encrypted-content"):
            await client_b.responses.create(
                model="m", input=second_input(rewritten(items, sent)), tools=[SHELL, APPLY_PATCH]
            )

        for chat in chats(engine.fake)[1:]:
            # Built from what the harness sent: its argument spelling, no reasoning.
            assistant = chat["messages"][1]
            assert "reasoning" not in assistant
            assert "reasoning_content" not in assistant
            calls = assistant["tool_calls"]
            assert calls[0]["function"]["arguments"] == '{"cmd": "echo café"}'
            assert (
                calls[1]["function"]["arguments"] == '{"input": "*** Begin Patch\\n*** End Patch"}'
            )
        notes = [c.error for c in await store.calls(rollout_b)]
        assert notes == [
            "assistant turn 1: reference not honoured (altered, or from another rollout)",
            "assistant turn 1: reference not honoured (altered, or from another rollout)",
            "assistant turn 1: reference not issued by rolltap",
        ]


async def test_an_edited_turn_is_sent_as_the_harness_wrote_it(
    store: Store, sdk: OpenAIFactory
) -> None:
    async with (
        fake_engine(FakeVLLM(script=script)) as engine,
        running_proxy(store, engine.url) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")
        items = await first_turn(client)
        edited = rewritten(items)
        edited[1]["arguments"] = '{"cmd": "rm -rf /tmp/x"}'

        await client.responses.create(
            model="m", input=second_input(edited), tools=[SHELL, APPLY_PATCH]
        )

        assistant = chats(engine.fake)[1]["messages"][1]
        assert assistant["tool_calls"][0]["function"]["arguments"] == '{"cmd": "rm -rf /tmp/x"}'
        (_, second) = await store.calls(rollout_id)
        assert second.error == (
            "assistant turn 1 differs from the answer its reference names; "
            "sent as the harness wrote it"
        )


async def test_references_survive_a_restart(db_url: str, tmp_path: Path) -> None:
    fake = FakeVLLM(script=script)
    async with fake_engine(fake) as engine:
        async with opened_store(db_url) as store:
            async with running_proxy(store, engine.url) as proxy:
                rollout_id, key = await new_rollout(store)
                async with openai.AsyncOpenAI(
                    base_url=f"{proxy.url}/r/{key}/v1", api_key="x"
                ) as client:
                    items = await first_turn(client)

        # A new process: nothing in memory, the secret read back from beside the database.
        async with opened_store(db_url) as store:
            async with running_proxy(store, engine.url) as proxy:
                async with openai.AsyncOpenAI(
                    base_url=f"{proxy.url}/r/{key}/v1", api_key="x"
                ) as client:
                    await client.responses.create(
                        model="m", input=second_input(rewritten(items)), tools=[SHELL, APPLY_PATCH]
                    )
            calls = await store.calls(rollout_id)

    assistant = chats(fake)[1]["messages"][1]
    # Rebuilt from the recorded response: the reasoning and the verbatim function arguments;
    # the custom tool's input was an object to the client, so it is re-serialized canonically.
    assert assistant["reasoning_content"] == "Two tools, then stop."
    assert assistant["tool_calls"][0]["function"]["arguments"] == SHELL_ARGS
    assert assistant["tool_calls"][0]["id"] == f"call_{calls[0].id}_0_0"
    assert assistant["tool_calls"][1]["function"]["arguments"] == (
        '{"input": "*** Begin Patch\\n*** End Patch"}'
    )
    assert calls[1].error is None
    path = secret_path(resolve_url(db_url))
    assert path.parent == tmp_path
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


async def test_a_configured_secret_replaces_the_persisted_one(
    store: Store, sdk: OpenAIFactory
) -> None:
    async with (
        fake_engine(FakeVLLM(script=script)) as engine,
        running_proxy(store, engine.url, secret="one") as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        items = await first_turn(sdk(f"{proxy.url}/r/{key}/v1"))
    async with (
        fake_engine(FakeVLLM(script=script)) as engine,
        running_proxy(store, engine.url, secret="two") as proxy,
    ):
        await sdk(f"{proxy.url}/r/{key}/v1").responses.create(
            model="m", input=second_input(rewritten(items)), tools=[SHELL, APPLY_PATCH]
        )
        assert "reasoning" not in chats(engine.fake)[0]["messages"][1]
    notes = [c.error for c in await store.calls(rollout_id)]
    assert notes[1] == "assistant turn 1: reference not honoured (altered, or from another rollout)"


def test_handles_are_bound_to_their_rollout_and_key() -> None:
    handles = Handles(b"k" * 32)
    token = handles.mint("rollout-a", "01M7ZAJB28QYE0S04EKYKHS1NF", 3)

    assert handles.read(token, "rollout-a") == (
        HandleCheck.VALID,
        Handle("01M7ZAJB28QYE0S04EKYKHS1NF", 3),
    )
    assert handles.read(token, "rollout-b") == (HandleCheck.INVALID, None)
    assert Handles(b"j" * 32).read(token, "rollout-a") == (HandleCheck.INVALID, None)
    assert handles.read(token[:-1], "rollout-a") == (HandleCheck.INVALID, None)
    assert handles.read("rt1.!!!", "rollout-a") == (HandleCheck.INVALID, None)
    assert handles.read("EqQBCkYICxgC", "rollout-a") == (HandleCheck.FOREIGN, None)
    assert handles.read(None, "rollout-a") == (HandleCheck.FOREIGN, None)


@pytest.mark.parametrize("configured", [None, "a configured secret"])
def test_the_signing_key_is_stable_and_never_the_secret_itself(
    tmp_path: Path, configured: str | None
) -> None:
    url = resolve_url(str(tmp_path / "store.sqlite"))

    first = signing_key(configured, url)

    assert signing_key(configured, url) == first
    assert len(first) == 32
    if configured is None:
        persisted = secret_path(url).read_text().strip()
        assert len(persisted) == 64
        assert persisted.encode() not in first
    else:
        assert not secret_path(url).exists()
        assert configured.encode() not in first
