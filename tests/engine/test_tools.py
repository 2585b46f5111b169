"""Hermes-style tool calls: rendering into prompts and parsing model output back."""

from __future__ import annotations

import json

import pytest

from rolltap.chatformat.tools import (
    ToolCall,
    ToolCallStream,
    parse_block,
    parse_tool_calls,
    partial_suffix,
    render_tool_call,
    tools_system_block,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"city": "Paris"}, '{"name": "f", "arguments": {"city": "Paris"}}'),
        ('{"city": "Paris"}', '{"name": "f", "arguments": {"city": "Paris"}}'),
        ({}, '{"name": "f", "arguments": {}}'),
        ({"q": "café"}, '{"name": "f", "arguments": {"q": "café"}}'),
        ("not json", '{"name": "f", "arguments": "not json"}'),
    ],
)
def test_render_tool_call(arguments: object, expected: str) -> None:
    assert render_tool_call("f", arguments) == f"<tool_call>\n{expected}\n</tool_call>"


def test_system_block_lists_each_tool_as_json_inside_tools_tags() -> None:
    block = tools_system_block([WEATHER])
    inside = block.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert json.loads(inside) == WEATHER
    assert "<tool_call>" in block


@pytest.mark.parametrize(
    ("body", "name", "arguments"),
    [
        (
            '{"name": "get_weather", "arguments": {"city": "Paris"}}',
            "get_weather",
            {"city": "Paris"},
        ),
        ('{"name": "ls", "arguments": {}}', "ls", {}),
        ('{"name": "ls"}', "ls", {}),
        ('{"name": "f", "arguments": "{\\"a\\": 1}"}', "f", {"a": 1}),
        ('{"name": "f", "parameters": {"a": [1, 2]}}', "f", {"a": [1, 2]}),
    ],
)
def test_parse_block_accepts_calls(body: str, name: str, arguments: dict[str, object]) -> None:
    call = parse_block(body)
    assert call is not None
    assert call.name == name
    assert json.loads(call.arguments) == arguments
    assert call.id.startswith("call_")


@pytest.mark.parametrize(
    "body",
    [
        "",
        "not json",
        '{"arguments": {}}',
        '{"name": 3, "arguments": {}}',
        '{"name": "f", "arguments": [1]}',
        '{"name": "f", "arguments": "not json"}',
        '["f"]',
    ],
)
def test_parse_block_rejects_malformed(body: str) -> None:
    assert parse_block(body) is None


@pytest.mark.parametrize(
    ("text", "content", "names"),
    [
        ("Hello there", "Hello there", []),
        ('<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>', None, ["a"]),
        (
            'Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>',
            "Let me check.\n",
            ["a"],
        ),
        (
            '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>',
            None,
            ["a", "b"],
        ),
        # an unclosed last block still counts when its JSON is whole (vLLM's hermes regex)
        ('<tool_call>\n{"name": "a", "arguments": {}}', None, ["a"]),
        # unparseable blocks stay content, verbatim
        ("<tool_call>oops</tool_call>", "<tool_call>oops</tool_call>", []),
        ("<tool_call>{broken", "<tool_call>{broken", []),
        ("a < b and <tool", "a < b and <tool", []),
    ],
)
def test_parse_tool_calls(text: str, content: str | None, names: list[str]) -> None:
    got_content, calls = parse_tool_calls(text)
    assert got_content == content
    assert [c.name for c in calls] == names


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_streaming_split_equals_whole_split(size: int) -> None:
    text = (
        'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<tool_call>bad</tool_call> tail <tool_"
    )
    stream = ToolCallStream()
    pieces = []
    for i in range(0, len(text), size):
        pieces += stream.push(text[i : i + size])
    pieces += stream.finish()
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    content = "".join(p for p in pieces if isinstance(p, str))
    whole_content, whole_calls = parse_tool_calls(text)
    assert content == whole_content
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole_calls]


def test_stream_holds_back_a_possible_tag_start() -> None:
    stream = ToolCallStream()
    assert stream.push("abc <tool") == ["abc "]
    assert stream.push("box>") == ["<toolbox>"]


@pytest.mark.parametrize(
    ("text", "tag", "expected"),
    [("abc<", "<x>", 1), ("abc<x", "<x>", 2), ("abc", "<x>", 0), ("<x>", "<x>", 0), ("", "<x>", 0)],
)
def test_partial_suffix(text: str, tag: str, expected: int) -> None:
    assert partial_suffix(text, tag) == expected
