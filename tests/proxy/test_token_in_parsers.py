"""Token-in answers split by vLLM-named parsers, whole and streamed piece by piece alike.

Fixtures are the strings each format's published chat template or model card has the model
write; malformed calls stay content, verbatim.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from rolltap.chatformat.callstream import JsonEcho
from rolltap.chatformat.parse import AnswerParser, Delta, parse_whole

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
    (
        "qwen3_xml",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        "",
        [PARIS],
    ),
    (
        "glm45",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
        "",
        [PARIS],
    ),
    (
        "kimi_k2",
        "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|>'
        "<|tool_calls_section_end|>",
        "Checking.",
        [PARIS],
    ),
    (
        "deepseek_v31",
        "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        '{"city": "Paris", "days": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "Checking.",
        [PARIS],
    ),
]
MALFORMED = [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>'),
    ("hermes", '<tool_call>\n{"name": "get_weather" "arguments": {}}</tool_call>'),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</tool_call>"),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Par'),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"ci'),
    # Cut at the token limit inside the call: no closing tag.
    ("hermes", 'On it.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"),
    (
        "qwen3_coder",
        "<tool_call><function=get_weather><parameter=>x</parameter></function></tool_call>",
    ),
    ("qwen3_coder", "<tool_call><function=get_weather></function> and more</tool_call>"),
    ("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\n</tool_call>"),
    (
        "kimi_k2",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": }<|tool_call_end|>',
    ),
    ("deepseek_v31", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"ci'),
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
    assert [c.name for c in out.calls()] == ["get_weather"] * len(arguments)
    assert [json.loads(c.arguments) for c in out.calls()] == arguments
    whole = parse_whole(text, None, parser, TOOLS)
    assert (whole.content, [c.arguments for c in whole.calls()]) == (
        out.content,
        [c.arguments for c in out.calls()],
    )


@pytest.mark.parametrize(("parser", "text"), MALFORMED)
def test_a_malformed_call_is_content_verbatim(parser: str, text: str) -> None:
    out = parse_whole(text, None, parser, TOOLS)
    assert out.tool_calls == []
    assert out.content == text


@pytest.mark.parametrize(
    ("parser", "text", "sent"),
    [
        (*MALFORMED[0], '{"city": '),
        (*MALFORMED[1], None),
        (*MALFORMED[2], "{"),
        (*MALFORMED[3], '{"city": "Par'),
        (*MALFORMED[4], '{"ci'),
    ],
)
def test_a_call_that_breaks_after_its_name_went_out_stays_a_call(
    parser: str, text: str, sent: str | None
) -> None:
    """Streamed, the name (and the arguments settled) went out before the break showed: they
    cannot be taken back, so the call ends with them, as vLLM's streaming parsers leave it; the
    block's text is not sent again as content. One that breaks before its name is content."""
    out = streamed(text, parser, 1)
    if sent is None:
        assert (out.tool_calls, out.content) == ([], text)
        return
    (call,) = out.calls()
    assert (call.name, call.arguments) == ("get_weather", sent)
    assert out.content == ("" if parser != "mistral" else text[: text.index("[TOOL_CALLS]")])


NOTE = '"a \\"quoted\\" line\\nand \\u00e9\\ud83d\\ude00"'
BIG = '{"city": "Paris", "days": 3, "metric": true, "note": ' + NOTE + ', "tags": [1, 2.5, null]}'
STREAMS = [
    (
        "hermes",
        f'On it.\n<tool_call>\n{{"name": "get_weather", "arguments": {BIG}}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',
        "On it.\n",
    ),
    (
        "qwen3_coder",
        "On it.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n"
        "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n"
        "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
        "</function>\n</tool_call>",
        "On it.\n",
    ),
    (
        "llama3_json",
        f'<|python_tag|>{{"name": "get_weather", "parameters": {BIG}}}; '
        '{"name": "get_weather", "parameters": {}}',
        "",
    ),
    (
        "mistral",
        f'On it.[TOOL_CALLS][{{"name": "get_weather", "arguments": {BIG}}}, '
        '{"name": "get_weather", "arguments": {}}]',
        "On it.",
    ),
    (
        "mistral",
        f"On it.[TOOL_CALLS]get_weather[ARGS]{BIG}[TOOL_CALLS]get_weather[ARGS]{{}}",
        "On it.",
    ),
]


@pytest.mark.parametrize(("parser", "text", "content"), STREAMS)
def test_calls_stream_as_vllm_sends_them(parser: str, text: str, content: str) -> None:
    """Pushed a character at a time: each call opens with its id and name and no arguments yet,
    then its arguments come in several fragments that add up to exactly what the whole answer
    holds; the second call gets the next index. Content is what comes before the first call
    (qwen3_coder's whole answer strips it, as vLLM's does)."""
    answer = AnswerParser(None, parser, TOOLS)
    chunks = [answer.push(ch) for ch in text] + [answer.finish()]
    parts = [part for chunk in chunks for part in chunk.tool_calls]
    whole = parse_whole(text, None, parser, TOOLS)
    assert "".join(c.content for c in chunks) == content
    assert whole.content == (content.strip() if parser == "qwen3_coder" else content)
    assert [(c.index, c.name) for c in whole.calls()] == [(0, "get_weather"), (1, "get_weather")]
    for call in whole.calls():
        own = [p for p in parts if p.index == call.index]
        assert (own[0].name, own[0].arguments) == (call.name, "")
        assert own[0].id is not None
        assert all(p.id is None for p in own[1:])
        assert "".join(p.arguments for p in own) == call.arguments
    first = [p for p in parts if p.index == 0]
    assert len(first) > 4  # streamed, not sent whole at the end
    # Every fragment is settled: what was sent is always a prefix of the final arguments.
    sent = ""
    for part in first[1:]:
        sent += part.arguments
        assert whole.calls()[0].arguments.startswith(sent)


@pytest.mark.parametrize(
    ("reasoning", "text", "split"),
    [
        (
            "qwen3",
            "<think>\nLet me see.\n</think>\n\nIt is 4.",
            ("\nLet me see.\n", "\n\nIt is 4."),
        ),
        # vLLM's qwen3 starts in reasoning: the template (or the model) opened <think>.
        ("qwen3", "It is 4.", ("It is 4.", "")),
        ("qwen3", "<think>a</think>b</think>c", ("a", "bc")),
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


ECHOED = [
    {},
    {"a": []},
    {"city": "Paris", "days": 3, "metric": True, "none": None, "n": -0, "f": 1.50, "e": 1e5},
    {"nested": {"x": [1, [2, {"y": "z"}], {}], "": ""}},
    {"text": 'quote " backslash \\ slash / tab \t newline \n bell \x07 e\u0301 é 😀 \u2028'},
]
SPELLINGS = [
    lambda v: json.dumps(v),
    lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")),
    lambda v: json.dumps(v, indent=2).replace("/", "\\/"),
]


@pytest.mark.parametrize("value", ECHOED)
@pytest.mark.parametrize("spell", SPELLINGS, ids=["ascii", "compact", "indented"])
@pytest.mark.parametrize("size", [1, 3, 10_000])
def test_json_arguments_stream_as_json_dumps_writes_them(value: Any, spell: Any, size: int) -> None:
    """Whatever spelling the model writes (escaped or raw unicode, `\\/`, surrogate pairs,
    any whitespace), the pieces add up to json.dumps of the value, and every piece is settled:
    what was written so far is a prefix of it."""
    text = spell(value)
    echo = JsonEcho(object_only=True)
    written = ""
    final = json.dumps(json.loads(text), ensure_ascii=False)
    for i in range(0, len(text), size):
        written += echo.feed(text[i : i + size])
        assert final.startswith(written)
    assert (written, echo.done, echo.broken) == (final, True, False)


@pytest.mark.parametrize(
    "text", ['{"a": tru}', '{"a" 1}', '{"a": [1,]}', '{"a": "x\ny"}', '["not an object"]', "{1: 2}"]
)
def test_json_that_cannot_be_json_stops_the_stream(text: str) -> None:
    echo = JsonEcho(object_only=True)
    written = "".join(echo.feed(ch) for ch in text)
    assert echo.broken
    assert not echo.done
    assert len(written) < len(text)


def test_qwen3_without_thinking_is_all_content() -> None:
    """`chat_template_kwargs: {"enable_thinking": false}`: no reasoning, as vLLM's qwen3, which
    gives the text verbatim (a `</think>` the model wrote included)."""
    answer = AnswerParser("qwen3", None, None, thinking=False)
    out = answer.push("It is 4.</think>")
    out.add(answer.finish())
    assert (out.reasoning, out.content) == ("", "It is 4.</think>")
