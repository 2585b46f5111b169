"""Chat templating: vLLM-style normalisation, SmolLM2's hermes fallback, native templates."""

from __future__ import annotations

from typing import Any

import pytest

from rolltap.chatformat.errors import Unrenderable
from rolltap.chatformat.template import ChatRenderer, normalize_messages

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]

# A Qwen3-flavoured template: native tools, re-serialised arguments, an opened <think>.
NATIVE = (
    "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %}{{ t.function.name }};"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.arguments | tojson }}</tool_call>"
    "{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"role": "user", "content": None}, {"role": "user", "content": ""}),
        (
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "user", "content": "a\nb"},
        ),
        (
            {"role": "assistant", "content": "x", "reasoning_content": "r"},
            {"role": "assistant", "content": "x", "reasoning": "r", "reasoning_content": "r"},
        ),
        (
            {"role": "assistant", "content": "x", "reasoning": "r"},
            {"role": "assistant", "content": "x", "reasoning": "r", "reasoning_content": "r"},
        ),
        (
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {**CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
                ],
            },
        ),
    ],
)
def test_normalize_like_vllm(message: dict[str, Any], expected: dict[str, Any]) -> None:
    assert normalize_messages([message], fold_tool_calls=False) == [expected]


def test_folded_tool_calls_become_hermes_text() -> None:
    [folded] = normalize_messages([CONVERSATION[1]], fold_tool_calls=True)
    assert folded == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call>",
    }


def test_image_parts_are_refused() -> None:
    message = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    with pytest.raises(Unrenderable):
        normalize_messages([message], fold_tool_calls=True)


def test_smollm_template_without_tools_matches_the_tokenizer(tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "What is 2+2?"}]
    rendered = ChatRenderer(tokenizer).render(messages)
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered.text == expected
    assert rendered.token_ids == tokenizer(expected, add_special_tokens=False)["input_ids"]


def test_smollm_fallback_renders_tools_calls_and_results(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    assert not renderer.native_tools
    text = renderer.render(CONVERSATION, [WEATHER]).text
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>'
    ) in text
    assert "<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n" in text


def test_fallback_appends_tools_to_an_existing_system_prompt(tokenizer: Any) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = ChatRenderer(tokenizer).render(messages, [WEATHER]).text
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert text.count("<|im_start|>system") == 1


def test_native_template_gets_tools_and_decoded_arguments(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer, NATIVE)
    assert renderer.native_tools
    history = [*CONVERSATION[:1], {**CONVERSATION[1], "reasoning": "look it up"}]
    text = renderer.render(history, [WEATHER]).text
    assert text.startswith("<|im_start|>system\nTOOLS:get_weather;<|im_end|>\n")
    assert '<think>look it up</think><tool_call>{"city": "Paris"}</tool_call>' in text
    assert text.endswith("<|im_start|>assistant\n<think>\n")


def test_template_errors_are_bad_requests(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer, "{{ raise_exception('no system role') }}")
    with pytest.raises(Unrenderable, match="no system role"):
        renderer.render([{"role": "user", "content": "x"}])


def test_template_kwargs_reach_the_template(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer, "{{ 'T' if enable_thinking else 'F' }}")
    messages = [{"role": "user", "content": "x"}]
    assert renderer.render(messages, template_kwargs={"enable_thinking": True}).text == "T"
