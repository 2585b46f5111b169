"""Drift classes, each produced for real: real templates (SmolLM2's own and a Qwen3-style one)
render real conversations, the real SmolLM2 tokenizer makes the ids, and a real store keeps them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web

from rolltap.analysis.detokenizer import EngineDetokenizer, HFDetokenizer
from rolltap.analysis.drift import Detokenizer
from rolltap.analysis.reading import analyze_rollout, rollout_trajectories
from rolltap.analysis.trajectory import RolloutTrajectories
from rolltap.analysis.turns import ConversationTurn, ToolCall, request_turns, response_turns
from rolltap.store import NewRollout, Store
from rolltap.store.models import CallDialect, DriftClass, LinkKind
from tests.support.chats import QWEN3_STYLE, Recorder, Renderer, smollm2_gguf, smollm2_tokenizer

SYSTEM = {"role": "system", "content": "You are a careful assistant."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="session")
def smollm2() -> Renderer:
    return Renderer(smollm2_tokenizer())


@pytest.fixture(scope="session")
def qwen3_style() -> Renderer:
    return Renderer(smollm2_tokenizer(), QWEN3_STYLE)


@pytest.fixture(scope="session")
def hf_detokenizer() -> HFDetokenizer:
    smollm2_tokenizer()
    path = smollm2_gguf()
    assert path is not None
    return HFDetokenizer.from_path(path)


async def _broken_rollout(
    store: Store,
    renderer: Renderer,
    sampled: list[int],
    answer: dict[str, Any],
    sent_back: dict[str, Any] | None = None,
    *,
    tools: list[dict[str, Any]] | None = None,
    decode_arguments: bool = True,
    history: list[dict[str, Any]] | None = None,
) -> Recorder:
    """Turn 1 samples `sampled`; turn 2 sends `sent_back` (default: the answer as received) and
    a new user message, or `history` instead when given; turn 3 goes on from turn 2."""
    created = await store.create_rollout(NewRollout())
    rec = Recorder(store, created.id, renderer, tools=tools, decode_arguments=decode_arguments)
    messages = [SYSTEM, {"role": "user", "content": "What is the weather in Paris?"}]
    await rec.call(messages, (sampled, answer))
    if history is None:
        messages = [
            *messages,
            {"role": "assistant", **(answer if sent_back is None else sent_back)},
            {"role": "user", "content": "Thanks. And tomorrow?"},
        ]
    else:
        messages = history
    ids, reply = rec.answer("Tomorrow it rains.")
    await rec.call(messages, (ids, reply))
    messages = [*messages, {"role": "assistant", **reply}, {"role": "user", "content": "Ok."}]
    await rec.call(messages, rec.answer("Bye."))
    return rec


def _break(built: RolloutTrajectories) -> tuple[DriftClass, str]:
    links = [t.link for t in built.trajectories if t.link is not None]
    assert len(links) == 1, links
    (link,) = links
    assert link.kind is LinkKind.BREAK
    assert link.drift is not None
    return link.drift.kind, link.drift.evidence


async def _classes(
    store: Store, rec: Recorder, detokenizer: Detokenizer
) -> tuple[tuple[DriftClass, str], tuple[DriftClass, str]]:
    without = await rollout_trajectories(store, rec.rollout_id)
    with_text = await rollout_trajectories(store, rec.rollout_id, detokenizer=detokenizer)
    return _break(without), _break(with_text)


async def test_template_strips_reasoning(
    store: Store, qwen3_style: Renderer, hf_detokenizer: HFDetokenizer
) -> None:
    text = "<think>\nParis in spring is mild.\n</think>\n\nIt is sunny in Paris."
    answer = {"content": "It is sunny in Paris.", "reasoning_content": "Paris in spring is mild."}
    rec = await _broken_rollout(store, qwen3_style, qwen3_style.ids(text + "<|im_end|>"), answer)

    tokens, text_ = await _classes(store, rec, hf_detokenizer)

    assert tokens == (DriftClass.REASONING_STRIPPED, "tokens")
    assert text_ == (DriftClass.REASONING_STRIPPED, "text")


async def test_stripped_reasoning_before_an_answer_opening_with_newlines(
    store: Store, qwen3_style: Renderer, hf_detokenizer: HFDetokenizer
) -> None:
    # Re-rendered without its reasoning, the answer's "\n\n" merges with the "\n" ending
    # "<|im_start|>assistant\n": the ids part one token before the sampled ones.
    text = "<think>\nParis in spring is mild.\n</think>\n\n\n\nIt is sunny in Paris."
    answer = {"content": "\n\nIt is sunny in Paris.", "reasoning_content": "Paris is mild."}
    sampled = qwen3_style.ids(text + "<|im_end|>")
    rec = await _broken_rollout(store, qwen3_style, sampled, answer)

    tokens, text_ = await _classes(store, rec, hf_detokenizer)

    built = await rollout_trajectories(store, rec.rollout_id)
    link = built.trajectories[1].link
    assert link is not None
    assert link.position == len(built.trajectories[0].prompt_ids) - 1
    assert tokens == (DriftClass.REASONING_STRIPPED, "tokens")
    assert text_ == (DriftClass.REASONING_STRIPPED, "text")


async def test_stripped_reasoning_whose_think_was_opened_by_the_prompt(
    store: Store, qwen3_style: Renderer, hf_detokenizer: HFDetokenizer
) -> None:
    # No reasoning parser: the answer carries its reasoning up to a "</think>" and no "<think>".
    content = "Paris in spring is mild.\n</think>\n\nIt is sunny in Paris."
    sampled = qwen3_style.ids(content + "<|im_end|>")
    rec = await _broken_rollout(store, qwen3_style, sampled, {"content": content})

    tokens, text = await _classes(store, rec, hf_detokenizer)

    assert tokens == (DriftClass.REASONING_STRIPPED, "tokens")
    assert text == (DriftClass.REASONING_STRIPPED, "text")


async def test_harness_strips_reasoning(store: Store, smollm2: Renderer) -> None:
    text = "<think>\nParis in spring is mild.\n</think>\n\nIt is sunny in Paris."
    answer = {"content": "It is sunny in Paris.", "reasoning_content": "Paris in spring is mild."}
    sent_back = {"content": "It is sunny in Paris."}
    rec = await _broken_rollout(store, smollm2, smollm2.ids(text + "<|im_end|>"), answer, sent_back)

    built = await rollout_trajectories(store, rec.rollout_id)

    assert _break(built) == (DriftClass.REASONING_STRIPPED, "messages")


def _tool_answer(arguments: str) -> dict[str, Any]:
    call = {"id": "call_1", "type": "function"}
    return {
        "content": "",
        "tool_calls": [{**call, "function": {"name": "get_weather", "arguments": arguments}}],
    }


async def test_template_reserializes_tool_arguments(
    store: Store, qwen3_style: Renderer, hf_detokenizer: HFDetokenizer
) -> None:
    sampled_text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>'
    )
    sampled = qwen3_style.ids(sampled_text + "<|im_end|>")
    rec = await _broken_rollout(
        store, qwen3_style, sampled, _tool_answer('{"city":"Paris"}'), tools=TOOLS
    )
    rendered = qwen3_style.text(
        [
            SYSTEM,
            {"role": "user", "content": "x"},
            {"role": "assistant", **_tool_answer({"city": "Paris"})},
        ],  # type: ignore[arg-type]
        TOOLS,
    )
    assert '{"city": "Paris"}' in rendered

    tokens, text = await _classes(store, rec, hf_detokenizer)

    assert tokens == (DriftClass.TOOL_ARGS, "tokens")
    assert text == (DriftClass.TOOL_ARGS, "text")


async def test_harness_reserializes_tool_arguments(store: Store, qwen3_style: Renderer) -> None:
    sampled_text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>'
    )
    rec = await _broken_rollout(
        store,
        qwen3_style,
        qwen3_style.ids(sampled_text + "<|im_end|>"),
        _tool_answer('{"city":"Paris"}'),
        _tool_answer(json.dumps({"city": "Paris"}, indent=1)),
        tools=TOOLS,
        decode_arguments=False,
    )

    built = await rollout_trajectories(store, rec.rollout_id)

    assert _break(built) == (DriftClass.TOOL_ARGS, "messages")


async def test_compaction_drops_history(store: Store, smollm2: Renderer) -> None:
    sampled = smollm2.ids("It is sunny in Paris.<|im_end|>")
    compacted = [
        SYSTEM,
        {"role": "user", "content": "Summary so far: the user asked about Paris; it is sunny."},
        {"role": "user", "content": "Thanks. And tomorrow?"},
    ]
    rec = await _broken_rollout(
        store, smollm2, sampled, {"content": "It is sunny in Paris."}, history=compacted
    )

    built = await rollout_trajectories(store, rec.rollout_id)

    assert _break(built) == (DriftClass.HISTORY_EDITED, "messages")
    assert built.faithfulness.breaks == {"history_edited": 1}
    assert built.trajectories[0].lost_tokens == len(sampled)


async def test_a_rejected_answer_asked_again_is_answer_dropped(
    store: Store, smollm2: Renderer
) -> None:
    """mini-swe-agent leaves an answer without an action out and asks again: normal mode names
    it as token-in mode does (`answer_dropped`), not `history_edited`."""
    sampled = smollm2.ids("I think the weather is nice.<|im_end|>")
    asked_again = [
        SYSTEM,
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "user", "content": "Format error: no tool call found. Try again."},
    ]
    rec = await _broken_rollout(
        store, smollm2, sampled, {"content": "I think the weather is nice."}, history=asked_again
    )

    built = await rollout_trajectories(store, rec.rollout_id)

    assert _break(built) == (DriftClass.ANSWER_DROPPED, "messages")
    assert built.faithfulness.breaks == {"answer_dropped": 1}
    link = built.trajectories[1].link
    assert link is not None
    assert link.drift is not None
    assert link.drift.message_index == 2
    assert "left out and asked again" in link.drift.note
    # Stored too: the analysis a finished rollout gets writes the break with its class.
    stored = await analyze_rollout(store, rec.rollout_id)
    assert stored.faithfulness.breaks == {"answer_dropped": 1}


async def test_reminder_injection_edits_history(store: Store, smollm2: Renderer) -> None:
    sampled = smollm2.ids("It is sunny in Paris.<|im_end|>")
    answer = {"content": "It is sunny in Paris."}
    injected = [
        SYSTEM,
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "user", "content": "<system-reminder>Stay on task.</system-reminder>"},
        {"role": "assistant", **answer},
        {"role": "user", "content": "Thanks. And tomorrow?"},
    ]
    rec = await _broken_rollout(store, smollm2, sampled, answer, history=injected)

    built = await rollout_trajectories(store, rec.rollout_id)

    assert _break(built) == (DriftClass.HISTORY_EDITED, "messages")
    link = built.trajectories[1].link
    assert link is not None
    assert link.drift is not None
    assert "inserted" in link.drift.note


async def test_end_of_turn_token_is_template_glue(
    store: Store, smollm2: Renderer, hf_detokenizer: HFDetokenizer
) -> None:
    # The model ended its turn with <|endoftext|>; the template writes <|im_end|> there.
    sampled = smollm2.ids("It is sunny in Paris.<|endoftext|>")
    assert sampled[-1] != smollm2.ids("<|im_end|>")[0]
    rec = await _broken_rollout(store, smollm2, sampled, {"content": "It is sunny in Paris."})

    tokens, text = await _classes(store, rec, hf_detokenizer)

    assert tokens == (DriftClass.TEMPLATE_GLUE, "tokens")
    assert text == (DriftClass.TEMPLATE_GLUE, "text")


async def test_retokenization_seen_in_text(
    store: Store, smollm2: Renderer, hf_detokenizer: HFDetokenizer
) -> None:
    sampled = smollm2.ids("It is sunny. ") + smollm2.ids("H") + smollm2.ids("AVING fun<|im_end|>")
    assert smollm2.decode(sampled) == "It is sunny. HAVING fun<|im_end|>"
    rec = await _broken_rollout(store, smollm2, sampled, {"content": "It is sunny. HAVING fun"})

    tokens, text = await _classes(store, rec, hf_detokenizer)

    assert tokens == (DriftClass.RETOKENIZATION, "tokens")
    assert text == (DriftClass.RETOKENIZATION, "text")


async def test_retokenized_first_token_is_not_inserted_reasoning(
    store: Store, smollm2: Renderer, hf_detokenizer: HFDetokenizer
) -> None:
    # SmolLM2 sampled "To" + "fu" (seed 2 of test_drift_e2e); re-encoded, "Tofu" is three ids
    # from the answer's very first token on, which is no insertion.
    sampled = smollm2.ids("To") + smollm2.ids("fu is my alias<|im_end|>")
    assert len(smollm2.ids("Tofu is my alias<|im_end|>")) > len(sampled)
    rec = await _broken_rollout(store, smollm2, sampled, {"content": "Tofu is my alias"})

    tokens, text = await _classes(store, rec, hf_detokenizer)

    assert tokens == (DriftClass.RETOKENIZATION, "tokens")
    assert text == (DriftClass.RETOKENIZATION, "text")


async def test_engine_detokenize_endpoint(
    store: Store, smollm2: Renderer, aiohttp_server: Any
) -> None:
    async def detokenize(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"prompt": smollm2.decode(body["tokens"])})

    async def broken(request: web.Request) -> web.Response:
        return web.json_response({"error": "no"}, status=500)

    app = web.Application()
    app.router.add_post("/detokenize", detokenize)
    app.router.add_post("/broken/detokenize", broken)
    server = await aiohttp_server(app)
    sampled = smollm2.ids("Sure. ") + smollm2.ids("H") + smollm2.ids("AVING<|im_end|>")
    rec = await _broken_rollout(store, smollm2, sampled, {"content": "Sure. HAVING"})

    good = EngineDetokenizer(str(server.make_url("/")), model="smollm2")
    bad = EngineDetokenizer(str(server.make_url("/broken")))
    with_engine = await rollout_trajectories(store, rec.rollout_id, detokenizer=good)
    fallback = await rollout_trajectories(store, rec.rollout_id, detokenizer=bad)

    assert _break(with_engine) == (DriftClass.RETOKENIZATION, "text")
    assert _break(fallback) == (DriftClass.RETOKENIZATION, "tokens")
    drift = with_engine.trajectories[1].link.drift  # type: ignore[union-attr]
    assert drift is not None
    assert drift.parent_text == drift.child_text == "Sure. HAVING<|im_end|>"


# --- the three dialects reduce to the same turns ---------------------------------------------


def _body(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    ("dialect", "request_", "response", "expected"),
    [
        (
            CallDialect.CHAT,
            {
                "messages": [
                    {"role": "developer", "content": [{"type": "text", "text": "Be brief"}]}
                ]
            },
            {"choices": [{"index": 0, "message": {"content": "<think>a</think>\n\nb"}}]},
            ([ConversationTurn("system", "Be brief")], [ConversationTurn("assistant", "b", "a")]),
        ),
        (
            CallDialect.RESPONSES,
            {
                "instructions": "Be brief",
                "input": [
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "hi"}],
                    },
                    {"type": "function_call_output", "call_id": "c", "output": "ok"},
                ],
            },
            {
                "output": [
                    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "r"}]},
                    {"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{}"},
                ]
            },
            (
                [
                    ConversationTurn("system", "Be brief"),
                    ConversationTurn("user", "hi"),
                    ConversationTurn("tool", "ok"),
                ],
                [ConversationTurn("assistant", "", "r", (ToolCall("shell", "{}"),))],
            ),
        ),
        (
            CallDialect.MESSAGES,
            {
                "system": [{"type": "text", "text": "Be brief", "cache_control": {}}],
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t", "content": "ok"},
                            {"type": "text", "text": "go on"},
                        ],
                    }
                ],
            },
            {
                "content": [
                    {"type": "thinking", "thinking": "r", "signature": "s"},
                    {"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "ls"}},
                ]
            },
            (
                [
                    ConversationTurn("system", "Be brief"),
                    ConversationTurn("tool", "ok"),
                    ConversationTurn("user", "go on"),
                ],
                [ConversationTurn("assistant", "", "r", (ToolCall("Bash", '{"command":"ls"}'),))],
            ),
        ),
    ],
)
def test_dialects_reduce_to_turns(
    dialect: CallDialect,
    request_: dict[str, Any],
    response: dict[str, Any],
    expected: tuple[list[ConversationTurn], list[ConversationTurn]],
) -> None:
    assert request_turns(dialect, _body(request_)) == expected[0]
    assert response_turns(dialect, _body(response)) == expected[1]
