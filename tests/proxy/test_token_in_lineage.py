"""Which earlier answer a request continues (lineage.py) and the bridge to it (bridge.py).

Bridges are rendered by the real SmolLM2 tokenizer through the engine's own renderer, with
SmolLM2's template and the Qwen3-style test template.
"""

from __future__ import annotations

from typing import Any

import pytest

from rolltap.chatformat.template import ChatRenderer
from rolltap.proxy.tokenin.bridge import Bridges, LocalTemplate
from rolltap.proxy.tokenin.lineage import (
    ANSWER_DROPPED,
    ASSISTANT_REWRITTEN,
    FIRST_TURN,
    HISTORY_EDITED,
    MULTIMODAL,
    NO_STOP_TOKEN,
    TAIL_UNSUPPORTED,
    TOOLS_CHANGED,
    AnsweredTurn,
    Continued,
    Lineages,
    answer_print,
    context_print,
    prefix_hashes,
)
from tests.support.chats import QWEN3_STYLE, smollm2_tokenizer

SYSTEM = {"role": "system", "content": "You are terse."}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
}
BODY: dict[str, Any] = {"model": "m", "tools": None}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str | None, *calls: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = list(calls)
    return message


def served(
    lineages: Lineages,
    messages: list[dict[str, Any]],
    answer: dict[str, Any],
    finish: str = "stop",
    body: dict[str, Any] = BODY,
) -> AnsweredTurn:
    """Record that `messages` were answered with `answer` (made-up ids: only identity matters)."""
    turn = AnsweredTurn(
        [len(messages)], [100 + len(messages)], finish, answer_print(answer), context_print(body)
    )
    lineages.add(prefix_hashes(messages), turn)
    return turn


def find(lineages: Lineages, messages: list[dict[str, Any]], body: dict[str, Any] = BODY) -> Any:
    return lineages.find(messages, prefix_hashes(messages), context_print(body))


def test_conversations_under_one_key_each_continue_their_own() -> None:
    lineages = Lineages()
    main = [SYSTEM, user("Fix the bug.")]
    title = [user("Give this conversation a title.")]
    sub_agent = [SYSTEM, user("Search the repository.")]
    turns = {
        "main": served(lineages, main, assistant("Looking.", CALL)),
        "title": served(lineages, title, assistant("Bug fixing")),
        "sub": served(lineages, sub_agent, assistant(None, CALL)),
    }
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "rainy"}

    for name, messages, answer in [
        ("main", main, assistant("Looking.", CALL)),
        ("sub", sub_agent, assistant(None, CALL)),
        ("title", title, assistant("Bug fixing")),
    ]:
        found = find(lineages, [*messages, answer, tool])
        assert isinstance(found, Continued)
        assert found.turn is turns[name]
        assert found.tail == [tool]


def test_a_harness_may_drop_reasoning_respell_arguments_and_remint_ids() -> None:
    lineages = Lineages()
    messages = [user("Weather in Paris?")]
    turn = served(lineages, messages, {**assistant(" ", CALL), "reasoning": "I should call."})
    respelled = {
        "id": "toolu_other",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    found = find(lineages, [*messages, assistant("", respelled), user("thanks")])
    assert isinstance(found, Continued)
    assert found.turn is turn


@pytest.mark.parametrize(
    ("history", "reason"),
    [
        ([user("Hi")], FIRST_TURN),
        # The same request again (a retry, a resample): a first turn, as it was.
        ([SYSTEM, user("Hi")], FIRST_TURN),
        # Its answer dropped and asked again (mini-swe-agent after a format error).
        ([SYSTEM, user("Hi"), user("Use the bash tool.")], ANSWER_DROPPED),
        # Few-shot assistant turns of a conversation never seen: a new conversation.
        ([user("Q"), assistant("A"), user("Hi")], FIRST_TURN),
        # Compaction: the first request's opening is kept, the rest rewritten.
        ([SYSTEM, user("Summary of it all"), assistant("Sure."), user("Go on")], HISTORY_EDITED),
        ([SYSTEM, user("Hi"), assistant("Hello, edited."), user("Go on")], ASSISTANT_REWRITTEN),
        ([SYSTEM, user("Hi"), assistant("Hello.")], TAIL_UNSUPPORTED),
        ([SYSTEM, user("Hi"), assistant("Hello."), SYSTEM, user("Go on")], TAIL_UNSUPPORTED),
        (
            [
                SYSTEM,
                user("Hi"),
                assistant("Hello."),
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
            ],
            MULTIMODAL,
        ),
    ],
)
def test_why_a_request_continues_nothing(history: list[dict[str, Any]], reason: str) -> None:
    lineages = Lineages()
    served(lineages, [SYSTEM, user("Hi")], assistant("Hello."))
    assert find(lineages, history) == reason


def test_a_truncated_answer_is_continued_but_not_with_other_tools() -> None:
    lineages = Lineages()
    cut = served(lineages, [user("Long story?")], assistant("Once upon"), finish="length")
    found = find(lineages, [user("Long story?"), assistant("Once upon"), user("go on")])
    assert isinstance(found, Continued)
    assert found.turn is cut
    served(lineages, [user("Hi")], assistant("Hello."))
    other = {**BODY, "tools": [{"type": "function", "function": {"name": "f"}}]}
    assert find(lineages, [user("Hi"), assistant("Hello."), user("Go")], other) == TOOLS_CHANGED


# -- bridges, rendered by the real tokenizer -----------------------------------------------------


def renderer(template: str | None = None) -> ChatRenderer:
    return ChatRenderer(smollm2_tokenizer(), template)


async def test_bridge_extends_an_append_only_conversation_exactly() -> None:
    """SmolLM2's own template renders plain turns append-only: the previous prompt, the answer
    as sampled (ending in <|im_end|>) and the bridge are the whole conversation rendered."""
    chat = renderer()
    tokenizer = smollm2_tokenizer()
    first = [SYSTEM, user("What is 2+2?")]
    prompt = chat.render(first).token_ids
    sampled = tokenizer.encode("4<|im_end|>", add_special_tokens=False)
    tail = [user("And doubled?")]

    bridge = await Bridges(LocalTemplate(chat)).bridge(sampled[-1], tail, None, None)

    assert isinstance(bridge, list)
    whole = chat.render([*first, assistant("4"), *tail]).token_ids
    assert prompt + sampled + bridge == whole
    assert (
        tokenizer.decode(bridge)
        == "\n<|im_start|>user\nAnd doubled?<|im_end|>\n<|im_start|>assistant\n"
    )


async def test_bridge_after_a_tool_call_keeps_the_sampled_call() -> None:
    """The Qwen3-style template re-spells arguments; the bridge only adds the tool turn."""
    tokenizer = smollm2_tokenizer()
    chat = renderer(QWEN3_STYLE.read_text())
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "rainy"}
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    bridge = await Bridges(LocalTemplate(chat)).bridge(end, [tool], tools, None)

    assert isinstance(bridge, list)
    assert (
        tokenizer.decode(bridge) == "\n<|im_start|>tool\nrainy<|im_end|>\n<|im_start|>assistant\n"
    )


async def test_no_bridge_after_an_answer_cut_by_a_stop_string() -> None:
    tokenizer = smollm2_tokenizer()
    period = tokenizer.encode(".", add_special_tokens=False)[-1]
    bridges = Bridges(LocalTemplate(renderer()))
    assert await bridges.bridge(period, [user("Go on")], None, None) == NO_STOP_TOKEN


async def test_an_answer_that_did_not_end_its_turn_is_ended_by_rolltap() -> None:
    """Cut at its limit, or stopped by a stop string: <|im_end|> is added, then the bridge, and
    the whole is what SmolLM2's (append-only) template renders of the conversation."""
    chat = renderer()
    tokenizer = smollm2_tokenizer()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    newline = tokenizer.encode("\n", add_special_tokens=False)[-1]
    bridges = Bridges(LocalTemplate(chat))
    first = [SYSTEM, user("Tell me a story.")]
    prompt = chat.render(first).token_ids
    sampled = tokenizer.encode("Once upon a time", add_special_tokens=False)
    tail = [user("Go on.")]

    for cut in (True, False):  # at the limit; by a stop string
        closing = await bridges.end_of_turn(sampled[-1], cut, None, None)
        assert closing == [end]
        bridge = await bridges.bridge(closing[-1], tail, None, None)
        assert isinstance(bridge, list)
        whole = chat.render([*first, assistant("Once upon a time"), *tail]).token_ids
        assert prompt + sampled + closing + bridge == whole

    # An answer that sampled its end of turn needs none, even reported cut (SGLang counts the
    # limit first); a cut one ending in the newline of the glue still does.
    assert await bridges.end_of_turn(end, True, None, None) == []
    assert await bridges.end_of_turn(end, False, None, None) == []
    assert await bridges.end_of_turn(newline, True, None, None) == [end]
