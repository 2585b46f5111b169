"""The replay cassette at the proxy's engine seam, in all three dialects, streaming and not.

A two-turn session (a tool call, then the harness sends the tool's output back) is recorded
through a proxy in front of a scripted engine. The same session then runs against a proxy with
no backend whose cassette serves that rollout: the same client sees the same answers and every
call matches. A different tool output diverges at the second call with a diff naming the
output; `until-divergence` refuses that call; `continue-live` sends it to an engine.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from rolltap.audit.replay import REPLAYS, REPORT_KEY, Mode, Outcome, ReplayReport, Served
from rolltap.proxy.answers import live_answer
from rolltap.proxy.replay import VERSION, Cassette
from rolltap.store import CallStatus, Capture, Store
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import fake_engine, new_rollout, running_proxy

COMMAND = '{"command": "echo $RANDOM"}'


def script(body: dict[str, Any]) -> Reply:
    if body["messages"][-1]["role"] == "tool":
        return Reply(text="The number is printed.")
    return Reply(
        text="Running it.",
        reasoning="A random number, then done.",
        tool_calls=[{"name": "bash", "arguments": COMMAND, "id": "call_engine_1"}],
    )


Session = Callable[[str, str, bool, str], Awaitable[list[Any]]]
"""(proxy url, rollout key, stream, tool output) -> what the client saw of each answer."""


async def chat_session(url: str, key: str, stream: bool, output: str) -> list[Any]:
    tools: Any = [
        {
            "type": "function",
            "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    messages: list[Any] = [{"role": "user", "content": "print a random number"}]
    seen: list[Any] = []
    async with openai.AsyncOpenAI(base_url=f"{url}/r/{key}/v1", api_key="x") as client:
        for _ in range(2):
            if stream:
                text, calls = "", {}
                chunks = await client.chat.completions.create(
                    model="m", messages=messages, tools=tools, stream=True
                )
                async for chunk in chunks:
                    for choice in chunk.choices:
                        text += choice.delta.content or ""
                        for c in choice.delta.tool_calls or ():
                            calls.setdefault(c.index, {"id": c.id, "args": ""})
                            calls[c.index]["args"] += (c.function and c.function.arguments) or ""
                message: dict[str, Any] = {"role": "assistant", "content": text}
                if calls:
                    message["tool_calls"] = [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {"name": "bash", "arguments": c["args"]},
                        }
                        for c in calls.values()
                    ]
            else:
                answer = await client.chat.completions.create(
                    model="m", messages=messages, tools=tools
                )
                message = answer.choices[0].message.model_dump(exclude_none=True)
            seen.append(message)
            messages.append(message)
            for call in message.get("tool_calls") or ():
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
    return seen


async def responses_session(url: str, key: str, stream: bool, output: str) -> list[Any]:
    tools: Any = [{"type": "function", "name": "bash", "parameters": {"type": "object"}}]
    items: list[Any] = [{"role": "user", "content": "print a random number"}]
    seen: list[Any] = []
    async with openai.AsyncOpenAI(base_url=f"{url}/r/{key}/v1", api_key="x") as client:
        for _ in range(2):
            kwargs: Any = {
                "model": "m",
                "input": items,
                "tools": tools,
                "include": ["reasoning.encrypted_content"],
            }
            if stream:
                async with client.responses.stream(**kwargs) as events:
                    response = await events.get_final_response()
            else:
                response = await client.responses.create(**kwargs)
            output_items = [item.model_dump(exclude_none=True) for item in response.output]
            seen.append([_without_ids(i) for i in output_items])
            items += output_items
            for item in output_items:
                if item["type"] == "function_call":
                    result = {"call_id": item["call_id"], "output": output}
                    items.append({"type": "function_call_output", **result})
    return seen


async def messages_session(url: str, key: str, stream: bool, output: str) -> list[Any]:
    tools: Any = [{"name": "bash", "input_schema": {"type": "object", "properties": {}}}]
    messages: list[Any] = [{"role": "user", "content": "print a random number"}]
    seen: list[Any] = []
    async with anthropic.AsyncAnthropic(base_url=f"{url}/r/{key}", api_key="x") as client:
        for _ in range(2):
            kwargs: Any = {
                "model": "m",
                "max_tokens": 500,
                "messages": messages,
                "tools": tools,
                "thinking": {"type": "enabled", "budget_tokens": 100},
                "metadata": {"user_id": f"session-{output}"},  # volatile: never compared
            }
            if stream:
                async with client.messages.stream(**kwargs) as events:
                    message = await events.get_final_message()
            else:
                message = await client.messages.create(**kwargs)
            blocks = [b.model_dump(mode="json", exclude_unset=True) for b in message.content]
            seen.append([_without_ids(b) for b in blocks])
            messages.append({"role": "assistant", "content": blocks})
            results = [
                {"type": "tool_result", "tool_use_id": b["id"], "content": output}
                for b in blocks
                if b["type"] == "tool_use"
            ]
            if results:
                messages.append({"role": "user", "content": results})
    return seen


def _without_ids(item: dict[str, Any]) -> dict[str, Any]:
    """What the client saw less the ids and references minted per call."""
    volatile = ("id", "encrypted_content", "signature")
    return {k: v for k, v in item.items() if k not in volatile}


SESSIONS: dict[str, Session] = {
    "chat": chat_session,
    "responses": responses_session,
    "messages": messages_session,
}
CASES = [(d, s) for d in SESSIONS for s in (False, True)]


@dataclass
class Recorded:
    rollout_id: str
    seen: list[Any]


@contextlib.asynccontextmanager
async def recorded_session(store: Store, dialect: str, stream: bool) -> AsyncIterator[Recorded]:
    async with fake_engine(FakeVLLM(script=script)) as engine:
        async with running_proxy(store, engine.url) as proxy:
            rollout_id, key = await new_rollout(store, batch_id="original")
            seen = await SESSIONS[dialect](proxy.url, key, stream, "4242")
        yield Recorded(rollout_id, seen)


@dataclass
class Replaying:
    """A proxy answering from `replay`, the cassette it was started with."""

    url: str
    replay: Cassette


@contextlib.asynccontextmanager
async def replaying(
    store: Store, original: str, mode: Mode = Mode.REPLAY, *backends: str
) -> AsyncIterator[Replaying]:
    cassette = await Cassette.load(
        store, original, mode=mode, live=live_answer, batches=["replays"]
    )
    async with running_proxy(store, *backends, answers=cassette) as proxy:
        yield Replaying(proxy.url, cassette)


@pytest.mark.parametrize(("dialect", "stream"), CASES)
async def test_a_session_replays_with_every_call_matched(
    store: Store, dialect: str, stream: bool
) -> None:
    async with recorded_session(store, dialect, stream) as original:
        async with replaying(store, original.rollout_id) as proxy:
            replay_id, key = await new_rollout(store, batch_id="replays")
            seen = await SESSIONS[dialect](proxy.url, key, stream, "4242")
            results = proxy.replay.results() if proxy.replay else []

    assert seen == original.seen
    assert [(r.outcome, r.served) for r in results] == [(Outcome.MATCHED, Served.RECORDED)] * 2
    recorded = await store.calls(original.rollout_id)
    replayed = await store.calls(replay_id)
    assert [r.recorded_call for r in results] == [c.id for c in recorded]
    assert [r.replay_call for r in results] == [c.id for c in replayed]
    for old, new in zip(recorded, replayed, strict=True):
        assert (new.status, new.capture) == (CallStatus.OK, Capture.TOKENS)
        assert new.backend == f"cassette:{original.rollout_id}"
        assert f"replayed from call {old.id}" in (new.error or "")
        old_tokens, new_tokens = await store.call_tokens(old.id), await store.call_tokens(new.id)
        assert new_tokens.prompt_ids.tolist() == old_tokens.prompt_ids.tolist()
        assert new_tokens.choices[0].token_ids.tolist() == old_tokens.choices[0].token_ids.tolist()
        assert new_tokens.choices[0].logprobs.tolist() == old_tokens.choices[0].logprobs.tolist()  # type: ignore[union-attr]


@pytest.mark.parametrize(("dialect", "stream"), CASES)
async def test_a_different_tool_output_diverges_at_the_next_call(
    store: Store, dialect: str, stream: bool
) -> None:
    async with recorded_session(store, dialect, stream) as original:
        async with replaying(store, original.rollout_id) as proxy:
            replay_id, key = await new_rollout(store, batch_id="replays")
            seen = await SESSIONS[dialect](proxy.url, key, stream, "1717")
            results = proxy.replay.results() if proxy.replay else []

    assert seen == original.seen  # a plain replay keeps serving the record
    first, second = results
    assert first.outcome is Outcome.MATCHED
    assert (second.outcome, second.served) == (Outcome.DIVERGED, Served.RECORDED)
    assert second.divergence is not None
    assert second.divergence.params == []
    (change,) = second.divergence.messages
    assert change.kind == "changed"
    assert any(line.startswith("-") and "4242" in line for line in change.diff), change.diff
    assert any(line.startswith("+") and "1717" in line for line in change.diff), change.diff
    assert "4242" in second.divergence.summary
    assert "1717" in second.divergence.summary
    diverged = (await store.calls(replay_id))[1]
    assert diverged.capture is not Capture.TOKENS  # the recorded ids belong to another prompt
    assert "its request diverged" in (diverged.error or "")


@pytest.mark.parametrize("dialect", list(SESSIONS))
async def test_until_divergence_refuses_the_diverged_call(store: Store, dialect: str) -> None:
    async with recorded_session(store, dialect, True) as original:
        async with replaying(store, original.rollout_id, Mode.UNTIL_DIVERGENCE) as proxy:
            replay_id, key = await new_rollout(store, batch_id="replays")
            with pytest.raises((openai.PermissionDeniedError, anthropic.PermissionDeniedError)):
                await SESSIONS[dialect](proxy.url, key, True, "1717")
            results = proxy.replay.results() if proxy.replay else []

    assert [(r.outcome, r.served) for r in results] == [
        (Outcome.MATCHED, Served.RECORDED),
        (Outcome.DIVERGED, Served.REFUSED),
    ]
    refused = (await store.calls(replay_id))[1]
    assert (refused.status, refused.http_status) == (CallStatus.FAILED, 403)
    assert "replay call 2 diverged" in (refused.error or "")


@pytest.mark.parametrize("dialect", list(SESSIONS))
async def test_continue_live_sends_the_diverged_call_to_the_engine(
    store: Store, dialect: str
) -> None:
    async with recorded_session(store, dialect, True) as original:
        live = FakeVLLM(script=lambda _: Reply(text="A live answer."))
        async with (
            fake_engine(live) as engine,
            replaying(store, original.rollout_id, Mode.CONTINUE_LIVE, engine.url) as proxy,
        ):
            replay_id, key = await new_rollout(store, batch_id="replays")
            seen = await SESSIONS[dialect](proxy.url, key, True, "1717")
            results = proxy.replay.results() if proxy.replay else []

    assert seen[0] == original.seen[0]
    assert "A live answer." in str(seen[1])
    assert [(r.outcome, r.served) for r in results] == [
        (Outcome.MATCHED, Served.RECORDED),
        (Outcome.DIVERGED, Served.LIVE),
    ]
    engine_calls = [b for p, _, b in live.requests if p == "/v1/chat/completions"]
    assert len(engine_calls) == 1
    assert "1717" in str(engine_calls[0]["messages"])
    first, second = await store.calls(replay_id)
    assert first.backend == f"cassette:{original.rollout_id}"
    assert (second.backend, second.capture) == (engine.url, Capture.TOKENS)


async def test_a_call_beyond_the_record_is_extra(store: Store) -> None:
    async with recorded_session(store, "chat", False) as original:
        async with replaying(store, original.rollout_id) as proxy:
            _, key = await new_rollout(store, batch_id="replays")
            await chat_session(proxy.url, key, False, "4242")
            async with aiohttp.ClientSession() as http:
                body = {"model": "m", "messages": [{"role": "user", "content": "more"}]}
                async with http.post(f"{proxy.url}/r/{key}/v1/chat/completions", json=body) as r:
                    status, error = r.status, (await r.json())["error"]
            results = proxy.replay.results() if proxy.replay else []

    assert (status, error["code"]) == (403, "replay_exhausted")
    assert [r.outcome for r in results] == [Outcome.MATCHED, Outcome.MATCHED, Outcome.EXTRA]


async def test_a_call_the_replay_never_made_is_missing(store: Store) -> None:
    async with recorded_session(store, "chat", False) as original:
        async with replaying(store, original.rollout_id) as proxy:
            _, key = await new_rollout(store, batch_id="replays")
            async with openai.AsyncOpenAI(base_url=f"{proxy.url}/r/{key}/v1", api_key="x") as c:
                await c.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": "print a random number"}],
                    tools=[
                        {
                            "type": "function",
                            "function": {
                                "name": "bash",
                                "parameters": {"type": "object", "properties": {}},
                            },
                        }
                    ],
                )
            results = proxy.replay.results() if proxy.replay else []

    assert [(r.position, r.outcome) for r in results] == [
        (1, Outcome.MATCHED),
        (2, Outcome.MISSING),
    ]


async def test_the_admin_api_serves_the_stored_report(store: Store) -> None:
    async with recorded_session(store, "chat", False) as original:
        async with replaying(store, original.rollout_id) as proxy:
            replay_id, key = await new_rollout(store, batch_id="replays")
            await chat_session(proxy.url, key, False, "1717")
            assert proxy.replay is not None
            report = ReplayReport(
                original=original.rollout_id,
                replay=replay_id,
                mode=Mode.REPLAY,
                calls=proxy.replay.results(),
                recorded_reward=1.0,
                replayed_reward=1.0,
                recorded_status="finished",
                replayed_status="finished",
                normalization=VERSION,
            )
            await store.update_rollout(replay_id, meta={REPORT_KEY: report.to_json()})
            await store.update_rollout(original.rollout_id, meta={REPLAYS: [replay_id]})
            async with aiohttp.ClientSession() as http:

                async def get(rollout_id: str) -> tuple[int, Any]:
                    url = f"{proxy.url}/admin/rollouts/{rollout_id}/replay"
                    async with http.get(url) as r:
                        return r.status, await r.json()

                by_replay, by_original = await get(replay_id), await get(original.rollout_id)
                unknown = await get("nope")
                other, _ = await new_rollout(store)
                without = await get(other)

    assert by_replay == (200, json.loads(json.dumps(report.to_json())))
    assert by_original == by_replay
    assert by_replay[1]["first_divergence"] == 2
    assert by_replay[1]["reproduced"] is False
    assert by_replay[1]["calls"][1]["divergence"]["messages"][0]["role"] == "tool"
    assert ReplayReport.from_json(by_replay[1]) == report
    assert unknown[0] == 404
    assert (without[0], without[1]["error"]["code"]) == (404, "no_replay")
