"""Trajectories of real rollouts: every drift class produced for real, end to end.

A harness written with the official openai SDK talks to the real proxy (on a SQLite store) in
front of real SmolLM2 engines: the session engine with SmolLM2's own chat template, and one with
a Qwen3-style template and the `think` reasoning parser. Like a real harness it sends back the
history it received; the engine's template re-renders it, and wherever that does not reproduce
the ids the model sampled the rollout splits. Nothing here writes an id by hand: every id and
logprob is the engine's, and each test checks the trajectories against `store.call_tokens`.

Sampling is greedy except where a case needs what only sampling gives (reasoning, a
non-canonical tokenization, two different choices): those use a fixed seed, found once offline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import openai
import pyarrow.parquet as pq
import pytest
from aiohttp import web
from click.testing import CliRunner
from openai.types.chat import ChatCompletion, ChatCompletionMessage

import rolltap.store
from rolltap.analysis import reader as blocking
from rolltap.analysis.detokenizer import EngineDetokenizer, HFDetokenizer
from rolltap.analysis.drift import Drift
from rolltap.analysis.reading import rollout_trajectories
from rolltap.analysis.segments import SegmentRole
from rolltap.analysis.trajectory import RolloutTrajectories, SegmentLink, Trajectory
from rolltap.cli.export import export
from rolltap.engine.launch import EngineProcess
from rolltap.engine.model import default_gguf_path
from rolltap.proxy.server import RunningProxy
from rolltap.store import CallStatus, RolloutStatus, Store
from rolltap.store.events import Declared
from rolltap.store.models import DriftClass, LinkKind
from tests.support.chats import QWEN3_STYLE
from tests.support.proxy import OpenAIFactory, new_rollout, running_proxy

pytestmark = [pytest.mark.model, pytest.mark.slow]

THINK_MODEL = "smollm-think"
THINK_SYSTEM = (
    "Think inside <think> </think> tags first, then answer.\n"
    "Example:\nuser: What is 2+3?\nassistant: <think>\n2 plus 3 is 5.\n</think>\n\nThe answer is 5."
)
THINK_SEED = 31
"""With THINK_SYSTEM at temperature 0.7, SmolLM2 opens its answer with <think> for this seed."""
RETOKENIZED_SEED = 2
"""At temperature 1.0 SmolLM2 answers "Name a city." with ids that are not how its tokenizer
encodes the same text ("Tofu ..."): searched offline over seeds 0-59 (six of them do)."""
SIBLING_SEED = 7
"""Two different answers to "Name a color." (n=2, temperature 1.0)."""
GREEDY = {"temperature": 0, "max_tokens": 30}
EXACT = {"logprobs": True, "extra_body": {"return_token_ids": True}}
"""What a client asks to see the engine's ids and logprobs itself."""
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


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite'}"


@pytest.fixture(scope="module")
def think_engine() -> Iterator[EngineProcess]:
    """SmolLM2 behind the Qwen3-style template, which drops earlier turns' reasoning and
    re-serialises tool-call arguments, with the `think` reasoning parser."""
    engine = EngineProcess.start(
        extra_args=(
            "--chat-template",
            str(QWEN3_STYLE),
            "--reasoning-parser",
            "think",
            "--served-model-name",
            THINK_MODEL,
            "--default-max-tokens",
            "48",
        )
    )
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def hf_detokenizer() -> HFDetokenizer:
    return HFDetokenizer.from_path(default_gguf_path())


@pytest.fixture
async def sdk() -> AsyncIterator[OpenAIFactory]:
    factory = OpenAIFactory()
    try:
        yield factory
    finally:
        await factory.close()


def sent_back(message: ChatCompletionMessage) -> dict[str, Any]:
    """The assistant turn as a harness keeps it: content, reasoning, tool calls as received."""
    kept: dict[str, Any] = {"role": "assistant", "content": message.content}
    reasoning = (message.model_extra or {}).get("reasoning")
    if reasoning:
        kept["reasoning_content"] = reasoning
    if message.tool_calls:
        kept["tool_calls"] = [call.model_dump() for call in message.tool_calls]
    return kept


@dataclass
class Harness:
    """An agent loop's view of the conversation: it sends its history and appends what it got."""

    client: openai.AsyncOpenAI
    model: str
    messages: list[dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)

    async def ask(self, **params: Any) -> ChatCompletion:
        return await self.client.chat.completions.create(
            model=self.model,
            messages=self.messages,  # type: ignore[arg-type]
            **{**self.params, **params},
        )

    async def stream(self, **params: Any) -> ChatCompletionMessage:
        """A streamed turn, put back together the way SDK users do."""
        chunks = await self.client.chat.completions.create(
            model=self.model,
            messages=self.messages,  # type: ignore[arg-type]
            stream=True,
            **{**self.params, **params},
        )
        assert isinstance(chunks, openai.AsyncStream)
        content = ""
        async for chunk in chunks:
            if chunk.choices:
                content += chunk.choices[0].delta.content or ""
        return ChatCompletionMessage(role="assistant", content=content)

    def keep(self, message: ChatCompletionMessage, *then: dict[str, Any]) -> None:
        self.messages += [sent_back(message), *then]


@dataclass
class Rollout:
    store: Store
    id: str
    proxy: RunningProxy
    url: str
    """The rollout's base URL on the proxy (what a harness gets as OPENAI_BASE_URL)."""

    def harness(self, sdk: OpenAIFactory, model: str, *messages: dict[str, Any]) -> Harness:
        return Harness(sdk(self.url), model, list(messages))

    async def call_ids(self) -> list[str]:
        return [c.id for c in await self.store.calls(self.id)]

    async def trajectories(self, detokenizer: Any = None) -> RolloutTrajectories:
        built = await rollout_trajectories(self.store, self.id, detokenizer=detokenizer)
        await assert_token_exact(self.store, built)
        return built


@pytest.fixture
async def own(store: Store, smollm_engine: EngineProcess) -> AsyncIterator[Rollout]:
    """A rollout on the proxy in front of the engine with SmolLM2's own template."""
    async with running_proxy(store, smollm_engine.url) as proxy:
        yield await _rollout(store, proxy)


@pytest.fixture
async def think(store: Store, think_engine: EngineProcess) -> AsyncIterator[Rollout]:
    """A rollout on the proxy in front of the Qwen3-style engine."""
    async with running_proxy(store, think_engine.url) as proxy:
        yield await _rollout(store, proxy)


async def _rollout(store: Store, proxy: RunningProxy) -> Rollout:
    rollout_id, key = await new_rollout(store, task_id="drift", sample_index=0)
    return Rollout(store, rollout_id, proxy, f"{proxy.url}/r/{key}/v1")


async def assert_token_exact(store: Store, built: RolloutTrajectories) -> None:
    """Each trajectory is its calls' prompts and sampled ids, nothing else: mask 1 exactly on the
    sampled ids of the merged calls, in order, each carrying the logprob the engine recorded."""
    for t in built.trajectories:
        full = np.concatenate([t.prompt_ids, t.response_ids])
        mask = np.concatenate([np.zeros(len(t.prompt_ids), np.int8), t.loss_mask])
        logprobs = np.concatenate([np.zeros(len(t.prompt_ids), np.float32), t.logprobs])
        expected_mask = np.zeros(len(full), np.int8)
        sampled: list[np.ndarray] = []
        recorded: list[np.ndarray] = []
        end = 0
        for call_id in t.call_ids:
            tokens = await store.call_tokens(call_id)
            start = len(tokens.prompt_ids)
            assert start >= end, "a call's prompt must contain everything merged before it"
            assert np.array_equal(full[:start], tokens.prompt_ids)
            (choice,) = [
                c
                for c in tokens.choices
                if np.array_equal(full[start : start + len(c.token_ids)], c.token_ids)
            ]
            end = start + len(choice.token_ids)
            expected_mask[start:end] = 1
            sampled.append(choice.token_ids)
            assert choice.logprobs is not None
            recorded.append(choice.logprobs)
        assert end == len(full)
        assert t.has_logprobs
        assert np.array_equal(mask, expected_mask)
        assert np.array_equal(full[mask == 1], np.concatenate(sampled))
        assert np.array_equal(logprobs[mask == 1], np.concatenate(recorded))
        assert not logprobs[mask == 0].any()
        assert t.sampled_tokens == int(mask.sum())


def assert_received(t: Trajectory, replies: list[tuple[ChatCompletion, int]]) -> None:
    """The trajectory's mask-1 ids and logprobs are exactly what the client received (it asked
    for ids and logprobs), reply by reply."""
    ids = [i for reply, c in replies for i in reply.choices[c].model_extra["token_ids"]]  # type: ignore[index]
    logprobs = [
        e.logprob
        for reply, c in replies
        for e in reply.choices[c].logprobs.content  # type: ignore[union-attr]
    ]
    assert t.response_ids[t.loss_mask == 1].tolist() == ids
    assert np.array_equal(t.logprobs[t.loss_mask == 1], np.asarray(logprobs, dtype=np.float32))


async def first_difference(store: Store, parent_call: str, child_call: str) -> int:
    """Where the child's prompt stops repeating the parent's prompt and sampled ids."""
    parent, child = await store.call_tokens(parent_call), await store.call_tokens(child_call)
    sequence = np.concatenate([parent.prompt_ids, parent.choices[0].token_ids])
    n = min(len(sequence), len(child.prompt_ids))
    differ = np.flatnonzero(sequence[:n] != child.prompt_ids[:n])
    return int(differ[0]) if differ.size else n


async def assert_reward_everywhere(rollout: Rollout, reward: float) -> RolloutTrajectories:
    await rollout.store.report(rollout.id, Declared(RolloutStatus.SUCCEEDED), reward=reward)
    built = await rollout_trajectories(rollout.store, rollout.id)
    assert built.trajectories
    assert all(t.reward == reward for t in built.trajectories)
    assert all(t.status is RolloutStatus.SUCCEEDED for t in built.trajectories)
    return built


def the_break(built: RolloutTrajectories) -> tuple[SegmentLink, Drift]:
    """The link of the one segment that broke off another, and its drift."""
    (link,) = [t.link for t in built.trajectories if t.link is not None]
    assert link.kind is LinkKind.BREAK
    assert link.drift is not None
    assert link.position == link.drift.position
    return link, link.drift


def read_back(db_url: str, rollout_id: str) -> list[Trajectory]:
    """The rollout's trajectories through the blocking reader a trainer uses."""
    with rolltap.store.open(db_url) as reader:
        return list(blocking.trajectories(reader, rollouts=rollout_id))


# --- 1. a clean chain ------------------------------------------------------------------------


async def test_clean_multi_turn_chain_is_one_faithful_segment(
    own: Rollout, sdk: OpenAIFactory, db_url: str, smollm_engine: EngineProcess
) -> None:
    chat = own.harness(sdk, smollm_engine.model, {"role": "user", "content": "What is 2+2?"})
    replies = []
    for follow_up in ("And doubled?", "Thanks!"):
        reply = await chat.ask(**GREEDY, **EXACT)
        replies.append((reply, 0))
        chat.keep(reply.choices[0].message, {"role": "user", "content": follow_up})
    replies.append((await chat.ask(**GREEDY, **EXACT), 0))

    built = await own.trajectories()

    (t,) = built.trajectories
    assert t.role is SegmentRole.MAIN
    assert t.link is None
    assert list(t.call_ids) == await own.call_ids()
    assert t.lost_tokens == 0
    assert built.faithfulness.share == 1.0
    assert built.faithfulness.breaks == {}
    assert t.rollout_faithfulness == 1.0
    assert_received(t, replies)
    tokens = await own.store.call_tokens(t.call_ids[0])
    assert np.array_equal(t.prompt_ids, tokens.prompt_ids)

    await assert_reward_everywhere(own, 1.0)
    (read,) = await asyncio.to_thread(read_back, db_url, own.id)
    assert read.reward == 1.0
    for name in ("prompt_ids", "response_ids", "loss_mask", "logprobs"):
        assert np.array_equal(getattr(read, name), getattr(t, name))


# --- 2. reasoning the template strips ----------------------------------------------------------


async def test_template_stripping_reasoning_breaks_at_the_answer(
    think: Rollout,
    sdk: OpenAIFactory,
    db_url: str,
    tmp_path: Path,
    hf_detokenizer: HFDetokenizer,
    think_engine: EngineProcess,
) -> None:
    chat = think.harness(
        sdk,
        THINK_MODEL,
        {"role": "system", "content": THINK_SYSTEM},
        {"role": "user", "content": "What is 4+4?"},
    )
    first = await chat.ask(temperature=0.7, seed=THINK_SEED, max_tokens=40)
    message = first.choices[0].message
    assert message.model_extra is not None
    assert message.model_extra["reasoning"]
    assert message.content
    chat.keep(message, {"role": "user", "content": "And 5+5?"})
    assert chat.messages[-2]["reasoning_content"] == message.model_extra["reasoning"]
    await chat.ask(**GREEDY)
    calls = await think.call_ids()

    by_tokens = await think.trajectories()
    by_text = await think.trajectories(hf_detokenizer)
    by_engine = await think.trajectories(EngineDetokenizer(think_engine.url, model=THINK_MODEL))

    assert [t.call_ids for t in by_text.trajectories] == [(calls[0],), (calls[1],)]
    link, drift = the_break(by_text)
    assert (link.parent_segment, link.call_id) == (0, calls[0])
    position = await first_difference(think.store, calls[0], calls[1])
    prompt_len = len(by_text.trajectories[0].prompt_ids)
    # Without its reasoning the answer opens with "\n\n", which merges with the "\n" closing
    # "<|im_start|>assistant\n" into one token: the ids part one token before the sampled ones,
    # inside the prompt, and the break still belongs to the answer.
    assert message.content.startswith("\n\n")
    assert position == prompt_len - 1
    assert (link.position, link.choice) == (position, None)
    assert (drift.kind, drift.evidence) == (DriftClass.REASONING_STRIPPED, "text")
    assert (drift.region, drift.region_call) == ("sampled", calls[0])
    assert drift.parent_text is not None
    assert "<think>" in drift.parent_text
    assert drift.child_text is not None
    assert "<think>" not in drift.child_text
    for other, evidence in ((by_tokens, "tokens"), (by_engine, "text")):
        _, d = the_break(other)
        assert (d.kind, d.evidence, d.position) == (
            DriftClass.REASONING_STRIPPED,
            evidence,
            position,
        )
    lost = by_text.trajectories[0]
    assert lost.lost_tokens == lost.sampled_tokens
    assert by_text.faithfulness.breaks == {"reasoning_stripped": 1}

    built = await assert_reward_everywhere(think, 0.25)
    out = tmp_path / "trajectories.parquet"
    args = ["--db", db_url, "--rollout", think.id, "--format", "parquet", "--out", str(out)]
    result = await asyncio.to_thread(
        CliRunner().invoke, export, [*args, "--tokenizer", str(default_gguf_path())]
    )
    assert result.exit_code == 0, result.output
    rows = pq.read_table(out).to_pylist()
    assert [r["segment"] for r in rows] == [t.segment for t in built.trajectories]
    for row, t in zip(rows, built.trajectories, strict=True):
        assert row["prompt_ids"] == t.prompt_ids.tolist()
        assert row["response_ids"] == t.response_ids.tolist()
        assert row["loss_mask"] == t.loss_mask.tolist()
        assert np.array_equal(np.asarray(row["logprobs"], np.float32), t.logprobs)
        assert row["reward"] == 0.25
        assert list(row["call_ids"]) == list(t.call_ids)
    assert rows[1]["drift"] == "reasoning_stripped"
    assert rows[1]["branch_position"] == position
    assert json.loads(rows[1]["drift_detail"])["evidence"] == "text"


# --- 3. tool-call arguments the template re-serialises -----------------------------------------


def text_few_shot(payload: str, prefix: str = "") -> list[dict[str, Any]]:
    """Earlier turns in which the assistant wrote its tool call as text (a harness that keeps
    raw model output), `payload` formatting the call's JSON; the model copies their style."""
    messages: list[dict[str, Any]] = []
    for i, city in enumerate(["London", "Rome"]):
        call = payload.format(city=city)
        messages += [
            {"role": "user", "content": f"What is the weather in {city}?"},
            {"role": "assistant", "content": f"{prefix}<tool_call>\n{call}\n</tool_call>"},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": "sunny"},
            {"role": "assistant", "content": f"It is sunny in {city}."},
        ]
    return [*messages, {"role": "user", "content": "What is the weather in Paris?"}]


async def tool_round(chat: Harness) -> tuple[ChatCompletionMessage, ChatCompletion]:
    """The model calls the tool; the harness sends the call back as received, with a result."""
    reply = await chat.ask(tools=[WEATHER_TOOL], temperature=0, max_tokens=40)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls is not None
    (call,) = message.tool_calls
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert call.function.arguments == '{"city": "Paris"}'  # type: ignore[union-attr]
    chat.keep(message, {"role": "tool", "tool_call_id": call.id, "content": "rainy"})
    return message, await chat.ask(tools=[WEATHER_TOOL], temperature=0, max_tokens=12)


async def test_reserialized_tool_arguments(
    think: Rollout, sdk: OpenAIFactory, hf_detokenizer: HFDetokenizer
) -> None:
    compact = '{{"name":"get_weather","arguments":{{"city":"{city}"}}}}'
    chat = think.harness(sdk, THINK_MODEL, *text_few_shot(compact))
    await tool_round(chat)
    calls = await think.call_ids()

    by_text = await think.trajectories(hf_detokenizer)
    by_tokens = await think.trajectories()

    assert [t.call_ids for t in by_text.trajectories] == [(calls[0],), (calls[1],)]
    link, drift = the_break(by_text)
    position = await first_difference(think.store, calls[0], calls[1])
    assert position > len(by_text.trajectories[0].prompt_ids)  # inside the sampled call
    assert link.position == position
    assert (drift.kind, drift.evidence, drift.region) == (DriftClass.TOOL_ARGS, "text", "sampled")
    assert drift.parent_text is not None
    assert '"arguments":{"city":"Paris"}' in drift.parent_text
    assert drift.child_text is not None
    assert '"arguments": {"city": "Paris"}' in drift.child_text
    _, d = the_break(by_tokens)
    assert (d.kind, d.evidence, d.position) == (DriftClass.TOOL_ARGS, "tokens", position)
    await assert_reward_everywhere(think, 0.0)


# --- 4. a harness that edits its history -------------------------------------------------------


async def test_compacted_history_is_an_edit(
    own: Rollout, sdk: OpenAIFactory, smollm_engine: EngineProcess
) -> None:
    chat = own.harness(sdk, smollm_engine.model, {"role": "user", "content": "What is 2+2?"})
    chat.keep(await chat.stream(**GREEDY), {"role": "user", "content": "And doubled?"})
    answer = await chat.stream(**GREEDY)
    # Compaction: the first exchange becomes a summary; the conversation goes on from there.
    chat.messages = [
        {"role": "user", "content": "Summary: 2+2 is 4, and doubled it is 8."},
        {"role": "assistant", "content": answer.content},
        {"role": "user", "content": "And tripled?"},
    ]
    chat.keep(await chat.stream(**GREEDY), {"role": "user", "content": "Thanks!"})
    await chat.stream(**GREEDY)
    calls = await own.call_ids()

    built = await own.trajectories()

    assert [t.call_ids for t in built.trajectories] == [tuple(calls[:2]), tuple(calls[2:])]
    link, drift = the_break(built)
    assert (link.parent_segment, link.call_id, link.choice) == (0, calls[1], None)
    position = await first_difference(own.store, calls[1], calls[2])
    assert link.position == position
    assert position < len(built.trajectories[0].prompt_ids)  # in the first user message
    assert (drift.kind, drift.evidence) == (DriftClass.HISTORY_EDITED, "messages")
    assert drift.message_index == 0
    assert built.trajectories[0].lost_tokens == built.trajectories[0].sampled_tokens
    assert built.trajectories[1].lost_tokens == 0
    assert [c.stream for c in await own.store.calls(own.id)] == [True] * 4
    await assert_reward_everywhere(own, 0.5)


# --- 5. the same text as other ids ------------------------------------------------------------


async def test_non_canonical_sample_is_retokenization(
    own: Rollout, sdk: OpenAIFactory, hf_detokenizer: HFDetokenizer, smollm_engine: EngineProcess
) -> None:
    chat = own.harness(sdk, smollm_engine.model, {"role": "user", "content": "Name a city."})
    reply = await chat.ask(temperature=1.0, seed=RETOKENIZED_SEED, max_tokens=12)
    chat.keep(reply.choices[0].message, {"role": "user", "content": "Thanks."})
    await chat.ask(temperature=0, max_tokens=10)
    calls = await own.call_ids()
    (choice,) = (await own.store.call_tokens(calls[0])).choices
    text = await hf_detokenizer.detokenize([choice.token_ids])
    assert text[0].removesuffix("<|im_end|>") == reply.choices[0].message.content

    by_text = await own.trajectories(hf_detokenizer)
    by_tokens = await own.trajectories()

    assert [t.call_ids for t in by_text.trajectories] == [(calls[0],), (calls[1],)]
    position = await first_difference(own.store, calls[0], calls[1])
    assert position >= len(by_text.trajectories[0].prompt_ids)
    _, drift = the_break(by_text)
    assert (drift.kind, drift.evidence, drift.position) == (
        DriftClass.RETOKENIZATION,
        "text",
        position,
    )
    assert drift.parent_text == drift.child_text
    _, d = the_break(by_tokens)
    assert (d.kind, d.evidence, d.position) == (DriftClass.RETOKENIZATION, "tokens", position)
    await assert_reward_everywhere(own, 1.0)


# --- 6. template glue and inserted reasoning ---------------------------------------------------


async def test_template_glue_between_text_and_tool_call(
    own: Rollout, sdk: OpenAIFactory, hf_detokenizer: HFDetokenizer, smollm_engine: EngineProcess
) -> None:
    # The model writes "Let me check." straight before <tool_call>; the engine renders a tool call
    # after content on a new line.
    spaced = '{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}'
    chat = own.harness(sdk, smollm_engine.model, *text_few_shot(spaced, prefix="Let me check."))
    message, _ = await tool_round(chat)
    assert message.content == "Let me check."
    calls = await own.call_ids()

    built = await own.trajectories(hf_detokenizer)

    assert [t.call_ids for t in built.trajectories] == [(calls[0],), (calls[1],)]
    _, drift = the_break(built)
    position = await first_difference(own.store, calls[0], calls[1])
    assert (drift.kind, drift.evidence, drift.position) == (
        DriftClass.TEMPLATE_GLUE,
        "text",
        position,
    )
    assert drift.parent_text is not None
    assert "check.<tool_call>" in drift.parent_text
    assert drift.child_text is not None
    assert "check.\n<tool_call>" in drift.child_text
    await assert_reward_everywhere(own, 1.0)


async def test_template_inserting_empty_reasoning(
    think: Rollout, sdk: OpenAIFactory, hf_detokenizer: HFDetokenizer
) -> None:
    chat = think.harness(sdk, THINK_MODEL, {"role": "user", "content": "What is 2+2?"})
    chat.params = {"extra_body": {"chat_template_kwargs": {"empty_think": True}}}
    reply = await chat.ask(**GREEDY)
    assert not (reply.choices[0].message.model_extra or {}).get("reasoning")
    chat.keep(reply.choices[0].message, {"role": "user", "content": "And doubled?"})
    await chat.ask(**GREEDY)
    calls = await think.call_ids()

    by_text = await think.trajectories(hf_detokenizer)
    by_tokens = await think.trajectories()

    position = await first_difference(think.store, calls[0], calls[1])
    assert position == len(by_text.trajectories[0].prompt_ids)  # the answer's first token
    for built, evidence in ((by_text, "text"), (by_tokens, "tokens")):
        _, drift = the_break(built)
        assert (drift.kind, drift.evidence, drift.position) == (
            DriftClass.REASONING_INSERTED,
            evidence,
            position,
        )
    _, drift = the_break(by_text)
    assert drift.child_text is not None
    assert drift.child_text.startswith("<think>\n\n</think>\n\n")
    await assert_reward_everywhere(think, 1.0)


# --- 7. side calls ----------------------------------------------------------------------------


async def test_side_calls_are_linked_segments_of_their_own(
    own: Rollout, sdk: OpenAIFactory, smollm_engine: EngineProcess
) -> None:
    chat = own.harness(sdk, smollm_engine.model, {"role": "user", "content": "What is 2+2?"})
    first = await chat.ask(**GREEDY)
    title = own.harness(
        sdk,
        smollm_engine.model,
        {"role": "user", "content": "What is 2+2?"},
        {"role": "user", "content": "Write a short title for this conversation."},
    )
    await title.ask(**GREEDY, extra_headers={"x-rolltap-purpose": "title"})
    unrelated = own.harness(
        sdk,
        smollm_engine.model,
        {"role": "system", "content": "Classify the sentiment: positive or negative."},
        {"role": "user", "content": "I love it."},
    )
    await unrelated.ask(temperature=0, max_tokens=5)
    chat.keep(first.choices[0].message, {"role": "user", "content": "And doubled?"})
    await chat.ask(**GREEDY)
    calls = await own.call_ids()

    built = await own.trajectories()

    main, titled, other = built.trajectories
    assert (main.role, main.call_ids, main.link) == (SegmentRole.MAIN, (calls[0], calls[3]), None)
    assert (titled.role, titled.call_ids) == (SegmentRole.SIDE, (calls[1],))
    assert titled.link is not None
    assert (titled.link.kind, titled.link.parent_segment) == (LinkKind.SIDE, 0)
    assert titled.link.call_id == calls[0]
    assert titled.link.position == await first_difference(own.store, calls[0], calls[1])
    assert titled.link.drift is None
    assert (other.role, other.call_ids) == (SegmentRole.SIDE, (calls[2],))
    assert (await own.store.calls(own.id))[1].purpose == "title"
    assert built.faithfulness.side_calls == 2
    assert built.faithfulness.breaks == {}
    assert built.faithfulness.share == 1.0
    await assert_reward_everywhere(own, 1.0)


# --- 8. n > 1 ---------------------------------------------------------------------------------


async def test_n_choices_are_siblings(
    own: Rollout, sdk: OpenAIFactory, smollm_engine: EngineProcess
) -> None:
    chat = own.harness(sdk, smollm_engine.model, {"role": "user", "content": "Name a color."})
    reply = await chat.ask(n=2, temperature=1.0, seed=SIBLING_SEED, max_tokens=8, **EXACT)
    zero, one = (c.model_extra["token_ids"] for c in reply.choices)  # type: ignore[index]
    assert zero != one
    # The harness goes on with the second answer: it joins the main line, the first is a sibling.
    chat.keep(reply.choices[1].message, {"role": "user", "content": "Why?"})
    second = await chat.ask(**GREEDY, **EXACT)
    calls = await own.call_ids()

    built = await own.trajectories()

    main, sibling = built.trajectories
    assert (main.role, main.call_ids) == (SegmentRole.MAIN, (calls[0], calls[1]))
    assert (sibling.role, sibling.call_ids) == (SegmentRole.SIBLING, (calls[0],))
    assert sibling.link is not None
    assert (sibling.link.kind, sibling.link.parent_segment) == (LinkKind.SIBLING, 0)
    assert (sibling.link.call_id, sibling.link.choice) == (calls[0], 1)
    shared = next(i for i, (a, b) in enumerate(zip(zero, one, strict=False)) if a != b)
    assert sibling.link.position == len(main.prompt_ids) + shared
    assert_received(main, [(reply, 1), (second, 0)])
    assert_received(sibling, [(reply, 0)])
    assert built.faithfulness.siblings == 1
    assert built.faithfulness.share == 1.0
    await assert_reward_everywhere(own, 0.5)


# --- 9. a retried request ---------------------------------------------------------------------


CHAT_PATH = "/v1/chat/completions"


class EngineFront:
    """A real HTTP server in front of an engine: it relays every request (health checks
    included) as it is, except that `chat` may meddle with chat requests."""

    def __init__(self, engine_url: str) -> None:
        self._engine_url = engine_url

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.path == CHAT_PATH:
            return await self.chat(request, body)
        return await self.relay(request, body)

    async def chat(self, request: web.Request, body: bytes) -> web.Response:
        return await self.relay(request, body)

    async def relay(self, request: web.Request, body: bytes) -> web.Response:
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        url = self._engine_url + request.path_qs
        async with (
            aiohttp.ClientSession() as session,
            session.request(request.method, url, data=body, headers=headers) as resp,
        ):
            answer = await resp.read()
        return web.Response(status=resp.status, body=answer, content_type=resp.content_type)


class FailingOnce(EngineFront):
    """The first chat request gets a 500 of the front's own."""

    failures_left = 1

    async def chat(self, request: web.Request, body: bytes) -> web.Response:
        if self.failures_left:
            self.failures_left -= 1
            error = {"message": "engine hiccup", "type": "InternalServerError", "code": 500}
            return web.json_response({"error": error}, status=500)
        return await self.relay(request, body)


class HoldingTheFirst(EngineFront):
    """The first chat answer is held back until the client, tired of waiting, sends the request
    again: the first attempt runs to the end on the engine, but its client has left."""

    def __init__(self, engine_url: str) -> None:
        super().__init__(engine_url)
        self._chats = 0
        self._again = asyncio.Event()

    async def chat(self, request: web.Request, body: bytes) -> web.Response:
        self._chats += 1
        if self._chats > 1:
            self._again.set()
            return await self.relay(request, body)
        answer = await self.relay(request, body)
        await self._again.wait()
        return answer


@contextlib.asynccontextmanager
async def behind(store: Store, front: EngineFront, aiohttp_server: Any) -> AsyncIterator[Rollout]:
    """A rollout on the proxy whose one backend is `front`."""
    server = await aiohttp_server(front.app())
    async with running_proxy(store, str(server.make_url("")).rstrip("/")) as proxy:
        yield await _rollout(store, proxy)


async def test_sdk_retry_leaves_one_sample(
    store: Store, sdk: OpenAIFactory, smollm_engine: EngineProcess, aiohttp_server: Any
) -> None:
    front = FailingOnce(smollm_engine.url)
    async with behind(store, front, aiohttp_server) as rollout:
        chat = rollout.harness(sdk, smollm_engine.model, {"role": "user", "content": "Hi!"})
        reply = await chat.ask(**GREEDY)
        assert front.failures_left == 0
        chat.keep(reply.choices[0].message, {"role": "user", "content": "How are you?"})
        await chat.ask(**GREEDY)
    failed, retried, second = await store.calls(rollout.id)

    built = await rollout.trajectories()

    assert (failed.status, failed.http_status) == (CallStatus.FAILED, 500)
    assert (retried.status, retried.retry_of, retried.retry_count) == (CallStatus.OK, failed.id, 1)
    (t,) = built.trajectories
    assert t.call_ids == (retried.id, second.id)
    assert [(s.call_id, s.reason) for s in built.skipped] == [(failed.id, "failed")]
    assert built.faithfulness.skipped_calls == 1
    assert built.faithfulness.share == 1.0
    await assert_reward_everywhere(rollout, 1.0)


async def test_retry_of_a_request_still_in_flight_leaves_one_sample(
    store: Store, sdk: OpenAIFactory, smollm_engine: EngineProcess, aiohttp_server: Any
) -> None:
    front = HoldingTheFirst(smollm_engine.url)
    async with behind(store, front, aiohttp_server) as rollout:
        # The client gives up on an answer after 6 s: far longer than one takes here.
        chat = Harness(
            sdk(rollout.url, timeout=6.0, max_retries=1),
            smollm_engine.model,
            [{"role": "user", "content": "Hi!"}],
            {"temperature": 0, "max_tokens": 12},
        )
        reply = await chat.ask()
        chat.keep(reply.choices[0].message, {"role": "user", "content": "How are you?"})
        await chat.ask()
        # The client that gave up closed its connection: the first attempt is cancelled (its
        # engine request aborted) and recorded as such.
        calls = await store.calls(rollout.id)
        while len(calls) < 3:
            await asyncio.sleep(0.05)
            calls = await store.calls(rollout.id)
    (retried,) = [c for c in calls if c.retry_count == 1]
    (original,) = [c for c in calls if c.body_hash == retried.body_hash and c is not retried]
    (second,) = [c for c in calls if c not in (retried, original)]

    built = await rollout.trajectories()

    assert (original.status, original.retry_count) == (CallStatus.CANCELLED, 0)
    assert original.error == "client disconnected before the answer was complete"
    assert retried.status is CallStatus.OK
    (t,) = built.trajectories
    assert t.call_ids == (retried.id, second.id)
    assert [(s.call_id, s.reason) for s in built.skipped] == [(original.id, "cancelled")]
    assert built.faithfulness.breaks == {}
    await assert_reward_everywhere(rollout, 1.0)


async def test_reasoning_closed_without_opening_is_stripped_too(
    think: Rollout, sdk: OpenAIFactory, hf_detokenizer: HFDetokenizer
) -> None:
    # Greedy, SmolLM2 answers THINK_SYSTEM's question with reasoning and a "</think>" but no
    # "<think>" (as models do whose template opens it): the parser leaves it all as content, and
    # the template takes what comes before "</think>" for reasoning, and drops it.
    chat = think.harness(
        sdk,
        THINK_MODEL,
        {"role": "system", "content": THINK_SYSTEM},
        {"role": "user", "content": "What is 4+4?"},
    )
    reply = await chat.ask(**GREEDY)
    message = reply.choices[0].message
    assert message.content is not None
    assert "</think>" in message.content
    assert "<think>" not in message.content
    chat.keep(message, {"role": "user", "content": "And 5+5?"})
    await chat.ask(**GREEDY)
    calls = await think.call_ids()

    by_text = await think.trajectories(hf_detokenizer)
    by_tokens = await think.trajectories()

    position = await first_difference(think.store, calls[0], calls[1])
    for built, evidence in ((by_text, "text"), (by_tokens, "tokens")):
        _, drift = the_break(built)
        assert (drift.kind, drift.evidence, drift.position) == (
            DriftClass.REASONING_STRIPPED,
            evidence,
            position,
        )
