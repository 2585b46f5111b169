"""Token-in answers split by vLLM-named parsers, whole and streamed piece by piece alike.

Fixtures are the strings each format's published chat template or model card has the model
write; malformed calls stay content, verbatim.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from rolltap.proxy.tokenin.parse import AnswerParser, Delta, parse_whole

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                },
            },
        },
    }
]
PARIS = {"city": "Paris", "days": 3}

CASES = [
    (
        "hermes",
        'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
        "\n</tool_call>",
        "Checking.\n",
        [PARIS],
    ),
    (
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        "",
        [PARIS],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}',
        "",
        [PARIS],
    ),
    (
        "mistral",
        'Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]',
        "Sure.",
        [PARIS],
    ),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}', "", [PARIS]),
]
MALFORMED = [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>'),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</tool_call>"),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Par'),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"ci'),
]


def streamed(text: str, parser: str, size: int, reasoning: str | None = None) -> Delta:
    answer = AnswerParser(reasoning, parser, TOOLS)
    out = Delta()
    for i in range(0, len(text), size):
        out.add(answer.push(text[i : i + size]))
    out.add(answer.finish())
    return out


@pytest.mark.parametrize(("parser", "text", "content", "arguments"), CASES)
@pytest.mark.parametrize("size", [1, 7, 10_000])
def test_calls_are_read_the_same_whole_and_streamed(
    parser: str, text: str, content: str, arguments: list[dict[str, Any]], size: int
) -> None:
    out = streamed(text, parser, size)
    assert out.content == content
    assert [c.name for c in out.tool_calls] == ["get_weather"] * len(arguments)
    assert [json.loads(c.arguments) for c in out.tool_calls] == arguments
    whole = parse_whole(text, None, parser, TOOLS)
    assert (whole.content, [c.arguments for c in whole.tool_calls]) == (
        out.content,
        [c.arguments for c in out.tool_calls],
    )


@pytest.mark.parametrize(("parser", "text"), MALFORMED)
@pytest.mark.parametrize("size", [1, 10_000])
def test_a_malformed_call_is_content_verbatim(parser: str, text: str, size: int) -> None:
    out = streamed(text, parser, size)
    assert out.tool_calls == []
    assert out.content == text


@pytest.mark.parametrize(
    ("reasoning", "text", "split"),
    [
        (
            "qwen3",
            "<think>\nLet me see.\n</think>\n\nIt is 4.",
            ("\nLet me see.\n", "\n\nIt is 4."),
        ),
        ("qwen3", "It is 4.", ("", "It is 4.")),
        # DeepSeek-R1's template opens <think> itself: the answer starts inside it.
        ("deepseek_r1", "Let me see.\n</think>\n\nIt is 4.", ("Let me see.\n", "\n\nIt is 4.")),
        ("deepseek_r1", "<think>Hm</think>4", ("Hm", "4")),
    ],
)
@pytest.mark.parametrize("size", [1, 10_000])
def test_reasoning_is_split_off(
    reasoning: str, text: str, split: tuple[str, str], size: int
) -> None:
    out = streamed(text, "hermes", size, reasoning)
    assert (out.reasoning, out.content) == split
