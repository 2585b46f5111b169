# ruff: noqa: E501  (the hand-written cases are model outputs, kept on one line each)
"""Write the parser-parity corpora: tests/contract/corpus/<parser>.jsonl.

    python tests/contract/make_corpus.py

One JSON object a line: `id`, `text` (the model's raw output, as the engine's detokenizer gives
it) and `source` (`hand`: an edge case written here; `gen`: drawn with the fixed seed below).
The same seed always writes the same files; the test reads the files, so a change of this
script shows in the diff of the corpora. Every case is run through rolltap's parser and vLLM's
of the same name (test_parser_parity.py).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

SEED = 25
GENERATED = 48
"""Drawn cases per parser, besides the hand-written ones."""
OUT = Path(__file__).parent / "corpus"

BIG = "".join(f'line {i}: {"é" if i % 7 == 0 else "x"} "quoted" \\ tab\t end\n' for i in range(150))
Args = dict[str, Any]
CALLS: list[tuple[str, Args]] = [
    ("get_weather", {"city": "Paris", "days": 3}),
    ("get_weather", {"city": "São Paulo", "days": 10, "metric": True}),
    ("get_weather", {"city": "東京 🗼", "days": 1, "metric": False}),
    ("run", {"command": 'echo "hi" && ls -la\n', "timeout": 30}),
    ("run", {"command": "printf 'a\\tb\\\\c' | tr -d '\\n'", "timeout": 2.5}),
    ("write_file", {"path": "/tmp/x.py", "content": 'def f():\n    return {"a": [1, 2]}\n'}),
    (
        "search",
        {
            "query": "emoji 🎉, a line separator \u2028 and </tool_call> in a string",
            "filters": {"lang": "en", "nested": {"deep": [1, {"x": None}], "empty": {}}},
            "tags": ["a", "b", "ü"],
        },
    ),
    ("write_file", {"path": "big.txt", "content": BIG}),
    ("noop", {}),
    ("search", {"query": "", "filters": {}, "tags": []}),
]
CONTENT = [
    "",
    "Let me check.",
    "Sure, I'll look that up.\n",
    "Voilà — ça marche. 你好 👍",
    "Text with a <b>tag</b> and a { brace [and bracket].",
    "\n\n",
]


def _calls(rng: random.Random) -> list[tuple[str, Args]]:
    return [rng.choice(CALLS) for _ in range(rng.choice([1, 1, 1, 2, 2, 3]))]


def _cut(rng: random.Random, text: str, start: int = 0) -> str:
    """The text cut at the token limit, somewhere after `start`."""
    return text[: rng.randrange(start + 1, len(text))] if len(text) > start + 1 else text


# -- writers: a call as each format has the model write it --------------------------------------


def _dumps(rng: random.Random, value: Any) -> str:
    return rng.choice(
        [
            lambda: json.dumps(value),
            lambda: json.dumps(value, ensure_ascii=False),
            lambda: json.dumps(value, ensure_ascii=False, separators=(",", ":")),
            lambda: json.dumps(value, ensure_ascii=False, indent=2),
        ]
    )()


def hermes_call(rng: random.Random, name: str, args: Args) -> str:
    body = _dumps(rng, {"name": name, "arguments": args})
    return f"<tool_call>\n{body}\n</tool_call>"


def _qwen_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return json.dumps(value, ensure_ascii=False)


def qwen3_coder_call(rng: random.Random, name: str, args: Args) -> str:
    params = "".join(f"<parameter={k}>\n{_qwen_value(v)}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def llama3_call(rng: random.Random, name: str, args: Args) -> str:
    return _dumps(rng, {"name": name, "parameters": args})


def glm45_call(rng: random.Random, name: str, args: Args) -> str:
    params = "".join(
        f"<arg_key>{k}</arg_key>\n<arg_value>"
        f"{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}</arg_value>\n"
        for k, v in args.items()
    )
    return f"<tool_call>{name}\n{params}</tool_call>"


KIMI_SECTION = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")


def kimi_call(rng: random.Random, name: str, args: Args, index: int) -> str:
    return (
        f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>"
        f"{_dumps(rng, args)}<|tool_call_end|>"
    )


V31_SECTION = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")


def v31_call(rng: random.Random, name: str, args: Args) -> str:
    return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{_dumps(rng, args)}<｜tool▁call▁end｜>"


def harmony_call(rng: random.Random, name: str, args: Args) -> str:
    return (
        f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json"
        f"<|message|>{_dumps(rng, args)}<|call|>"
    )


# -- per parser: hand-written cases, and a drawn case ---------------------------------------------


def _tagged(
    write: Callable[[random.Random, str, Args], str],
) -> Callable[[random.Random], str]:
    """A drawn case for a format whose calls stand between content: content, calls, content,
    sometimes cut at the token limit or broken."""

    def draw(rng: random.Random) -> str:
        before, after = rng.choice(CONTENT), rng.choice(["", "", "\n", "Done."])
        calls = [write(rng, name, args) for name, args in _calls(rng)]
        text = before + "\n".join(calls) + after
        roll = rng.random()
        if roll < 0.2:
            return _cut(rng, text, len(before))
        if roll < 0.3:
            return rng.choice(CONTENT[1:])
        if roll < 0.4:
            at = rng.randrange(len(before), len(text))
            return text[:at] + rng.choice(["}", '"', ",", ""]) + text[at + 1 :]
        return text

    return draw


def _llama3_draw(rng: random.Random) -> str:
    calls = [llama3_call(rng, n, a) for n, a in _calls(rng)]
    text = rng.choice(["", "<|python_tag|>"]) + rng.choice(["; ", ";"]).join(calls)
    roll = rng.random()
    if roll < 0.2:
        return _cut(rng, text)
    if roll < 0.3:
        return rng.choice(CONTENT[1:])
    if roll < 0.4:
        return rng.choice(CONTENT[1:]) + " " + text
    return text


def _mistral_draw(rng: random.Random) -> str:
    entries = [{"name": n, "arguments": a} for n, a in _calls(rng)]
    text = rng.choice(CONTENT) + "[TOOL_CALLS]" + _dumps(rng, entries)
    roll = rng.random()
    if roll < 0.2:
        return _cut(rng, text, text.index("[TOOL_CALLS]"))
    if roll < 0.3:
        return rng.choice(CONTENT[1:])
    return text


def mistral_v11_call(rng: random.Random, name: str, args: Args) -> str:
    return f"[TOOL_CALLS]{name}[ARGS]{_dumps(rng, args)}"


def _mistral_v11_draw(rng: random.Random) -> str:
    before = rng.choice(CONTENT)
    text = before + "".join(mistral_v11_call(rng, n, a) for n, a in _calls(rng))
    roll = rng.random()
    if roll < 0.2:
        return _cut(rng, text, len(before))
    if roll < 0.3:
        return rng.choice(CONTENT[1:])
    if roll < 0.4:
        at = rng.randrange(len(before), len(text))
        return text[:at] + rng.choice(["}", '"', ",", ""]) + text[at + 1 :]
    return text


def _kimi_draw(rng: random.Random) -> str:
    calls = [kimi_call(rng, n, a, i) for i, (n, a) in enumerate(_calls(rng))]
    before = rng.choice(CONTENT)
    text = before + KIMI_SECTION[0] + "".join(calls) + KIMI_SECTION[1]
    roll = rng.random()
    if roll < 0.2:
        return _cut(rng, text, len(before))
    if roll < 0.3:
        return rng.choice(CONTENT[1:])
    return text


def _v31_draw(rng: random.Random) -> str:
    calls = [v31_call(rng, n, a) for n, a in _calls(rng)]
    before = rng.choice(CONTENT)
    text = before + V31_SECTION[0] + "".join(calls) + V31_SECTION[1]
    roll = rng.random()
    if roll < 0.2:
        return _cut(rng, text, len(before))
    if roll < 0.3:
        return rng.choice(CONTENT[1:])
    return text


def _harmony_draw(rng: random.Random) -> str:
    parts = []
    if rng.random() < 0.7:
        parts.append(f"<|channel|>analysis<|message|>{rng.choice(THOUGHTS)}<|end|>")
        head = "<|start|>assistant"
    else:
        head = ""
    roll = rng.random()
    if roll < 0.5:
        name, args = rng.choice(CALLS)
        call = harmony_call(rng, name, args)
        parts.append(call if head else call.removeprefix("<|start|>assistant"))
    else:
        parts.append(f"{head}<|channel|>final<|message|>{rng.choice(CONTENT[1:])}<|return|>")
    text = "".join(parts)
    if rng.random() < 0.15:
        return _cut(rng, text)
    return text


THOUGHTS = [
    "The user wants the weather. I should call get_weather.",
    "Hmm — 2+2 = 4, trivially. Ünïcödé 思考 🤔",
    "Multi\nline\n\nthinking with <tags> and </thought>.",
    "",
    " leading and trailing spaces ",
]


def _reasoning_draw(opened_by_prompt: bool) -> Callable[[random.Random], str]:
    def draw(rng: random.Random) -> str:
        thought, content = rng.choice(THOUGHTS), rng.choice(CONTENT)
        shape = rng.choice(["full", "full", "no_open", "no_close", "none", "cut"])
        if shape == "none":
            return content
        start = "" if shape == "no_open" else rng.choice(["<think>", "<think>\n"])
        if opened_by_prompt and rng.random() < 0.5 and shape != "no_close":
            start = ""
        if shape == "no_close":
            return start + thought
        gap = rng.choice(["", "\n\n"])
        text = f"{start}{thought}</think>{gap}{content}"
        return _cut(rng, text) if shape == "cut" else text

    return draw


def _qwen3_tools_draw(
    write: Callable[[random.Random, str, Args], str],
) -> Callable[[random.Random], str]:
    """Qwen3 with tools: a thought (closed, unclosed, opened by the model or by the prompt,
    or none), then content and calls, sometimes cut at the token limit."""

    def draw(rng: random.Random) -> str:
        thought = rng.choice(THOUGHTS)
        shape = rng.choice(["closed", "closed", "opened", "unclosed", "none"])
        head = {
            "closed": f"{thought}</think>" + rng.choice(["", "\n\n"]),
            "opened": f"<think>{thought}</think>\n\n",
            "unclosed": thought + rng.choice(["", "\n"]),
            "none": "",
        }[shape]
        calls = [write(rng, name, args) for name, args in _calls(rng)]
        content = rng.choice(CONTENT) if shape != "unclosed" else ""
        text = head + content + "\n".join(calls) + rng.choice(["", "", "\n", "Done."])
        roll = rng.random()
        if roll < 0.2:
            return _cut(rng, text, len(head))
        if roll < 0.3:
            return head + rng.choice(CONTENT[1:])
        return text

    return draw


def _qwen3_tools_hand(call: str) -> list[str]:
    return [
        call,
        "Plan: look it up.\n" + call,
        "Plan.</think>\n\n" + call,
        "<think>\nPlan.\n</think>\n\nChecking.\n" + call,
        "Plan.</think>" + call + "</think>after",
        "Plan.</think>Answer without calls.",
        "<think>Plan.</think>" + call + call,
        "Plan." + call + "</think>",
        "Thinking about <tool_call> tags</think>done",
        "Plan.</think>" + call[: len(call) // 2],
        "Plan.</think>one</think>two",
        "",
    ]


def _hermes_hand() -> list[str]:
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    return [
        "No calls here.",
        "",
        call,
        "Checking.\n" + call,
        call + "\nDone.",
        "Before " + call + " between " + call + " after",
        call + call + call,
        '<tool_call>{"name": "noop", "arguments": {}}</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>',
        '<tool_call>\n{"name": "get_weather" "arguments": {}}</tool_call>',
        '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>',
        '<tool_call>\n{"name": 42, "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": [1, 2]}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather"}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "parameters": {"city": "Paris"}}\n</tool_call>',
        call + '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>',
        "Talking about <tool_call> tags in prose.",
        "A partial tag at the end <tool_",
        "<tool_call></tool_call>",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "city": "Rome"}}\n</tool_call>',
        '<tool_call>\n{"name": "search", "arguments": {"query": "\\u00e9\\ud83d\\ude00 \\/ \\"q\\""}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"days": 1e2, "n": -0.0, "x": 1.50}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}} trailing\n</tool_call>',
        '<tool_call>\n{"name": "noop", "arguments": null}\n</tool_call>',
        'Hi<tool_call>\n{"name": "noop", "arguments": null }\n</tool_call>' + call,
    ]


def _qwen3_coder_hand() -> list[str]:
    one = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    )
    return [
        "No calls here.",
        one,
        "Checking.\n" + one,
        one + "\nDone.",
        "Before " + one + " between " + one + " after",
        "<tool_call>\n<function=noop>\n</function>\n</tool_call>",
        "<tool_call><function=get_weather><parameter=city>Paris</parameter></function></tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=metric>\nTrue\n</parameter>\n</function>\n</tool_call>",
        '<tool_call>\n<function=get_weather>\n<parameter=unknown>\n{"a": 1}\n</parameter>\n</function>\n</tool_call>',
        "<tool_call>\n<function=run>\n<parameter=timeout>\n5\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=run>\n<parameter=timeout>\n5.0\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=search>\n<parameter=filters>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=tags>\n['x', 'y']\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nnull\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</tool_call>",
        "<tool_call><function=get_weather><parameter=>x</parameter></function></tool_call>",
        "<tool_call><function=get_weather></function> and more</tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n",
        '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',
        "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>",
        "<tool_call>\n<function=write_file>\n<parameter=content>\n  indented\n\n</parameter>\n</function>\n</tool_call>",
    ]


def _llama3_hand() -> list[str]:
    return [
        "No calls here.",
        '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}',
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "noop", "parameters": {}}',
        '{"name": "get_weather", "parameters": {"city": "Par',
        'Sure! {"name": "get_weather", "parameters": {"city": "Paris"}}',
        '{"name": "get_weather", "parameters": {"city": "Paris"}} and then text',
        '{"not_a_call": true}',
        '{"name": "get_weather", "parameters": "city=Paris"}',
        '  {"name": "noop", "parameters": {}}  ',
        "{",
        '{"name": "get_weather", "parameters": {"city": "Paris"}};',
        '{"name": "noop", "parameters": null}',
        '{"name": "noop", "parameters": null}; {"name": "get_weather", "parameters": {"city": "Paris"}}',
    ]


def _mistral_hand() -> list[str]:
    return [
        "No calls here.",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]',
        'Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "noop", "arguments": {}}]',
        '[TOOL_CALLS][{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}]',
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"ci',
        '[TOOL_CALLS]{"name": "get_weather", "arguments": {"city": "Paris"}}',
        "[TOOL_CALLS]",
        "[TOOL_CALLS]not json",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}] trailing',
        '[TOOL_CALLS][{"arguments": {"city": "Paris"}}]',
        '[TOOL_CALLS][{"name": "noop", "arguments": null}]',
    ]


def _mistral_v11_hand() -> list[str]:
    one = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}'
    return [
        "No calls here.",
        one,
        "Sure." + one,
        one + "[TOOL_CALLS]noop[ARGS]{}",
        one + " trailing",
        one + "]",
        one + "\n",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Par',
        "[TOOL_CALLS]get_weather[ARGS]",
        "[TOOL_CALLS]get_weather",
        '[TOOL_CALLS]get_weather{"city": "Paris"}',
        "[TOOL_CALLS]noop[ARGS]null",
        '[TOOL_CALLS] get_weather [ARGS] {"city": "Paris"}',
        '[TOOL_CALLS][ARGS]{"city": "Paris"}',
        "[TOOL_CALLS]get_weather[ARGS][1, 2]",
        '[TOOL_CALLS]get_weather[ARGS]"{\\"city\\": \\"Paris\\"}"',
        '[TOOL_CALLS]run[ARGS]{"command": "cat <<\'EOF\' > a.txt\\nhi \\"there\\"\\nEOF\\n"}',
        "[TOOL_CALLS]",
        "[TOOL_CALLS]not a call",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    ]


def _glm45_hand() -> list[str]:
    one = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
    return [
        "No calls here.",
        one,
        "Checking.\n" + one,
        one + "\nDone.",
        one + "\n" + one,
        "<tool_call>noop\n</tool_call>",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par",
        '<tool_call>search\n<arg_key>filters</arg_key>\n<arg_value>{"a": [1]}</arg_value>\n</tool_call>',
        "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>three</arg_value>\n</tool_call>",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n</tool_call>",
    ]


def _kimi_hand() -> list[str]:
    b, e = KIMI_SECTION
    one = '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
    return [
        "No calls here.",
        b + one + e,
        "Checking." + b + one + e,
        b + one + one.replace(":0", ":1") + e,
        b
        + '<|tool_call_begin|>get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
        + e,
        b + '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Par',
        b
        + '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": }<|tool_call_end|>'
        + e,
        b + one + e + " after",
        b
        + "<|tool_call_begin|>functions.noop:0<|tool_call_argument_begin|>null<|tool_call_end|>"
        + e,
    ]


def _v31_hand() -> list[str]:
    b, e = V31_SECTION
    one = '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
    return [
        "No calls here.",
        b + one + e,
        "Checking." + b + one + e,
        b + one + one + e,
        b + '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Par',
        b + '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": }<｜tool▁call▁end｜>' + e,
        b + one + e + " after",
        b + "<｜tool▁call▁begin｜>noop<｜tool▁sep｜>null<｜tool▁call▁end｜>" + e,
    ]


def _harmony_hand() -> list[str]:
    call = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
    return [
        "<|channel|>final<|message|>It is 4.<|return|>",
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.<|return|>",
        call,
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant" + call,
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": }<|call|>',
        '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris"}<|call|>',
        "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant" + call,
        "<|channel|>analysis<|message|>Cut in the mid",
        "<|channel|>final<|message|>Cut in the fin",
    ]


def _qwen3_reasoning_hand() -> list[str]:
    return [
        "<think>\nLet me see.\n</think>\n\nIt is 4.",
        "It is 4.",
        "<think>Unclosed thinking",
        "Thinking without an opening tag</think>The answer.",
        "<think></think>",
        "<think>\n\n</think>\n\nEmpty thought.",
        "  <think>Leading space</think>x",
        "<think>one</think>two</think>three",
        "<think>nested <think>inner</think> outer</think> end",
        "",
        # An answer that is only a call: vLLM's qwen3 ends reasoning at <tool_call>.
        '<tool_call>\n{"name": "run", "arguments": {"command": "ls"}}\n</tool_call>',
        'Plan: list the files.\n<tool_call>\n{"name": "run", "arguments": {"command": "ls"}}\n</tool_call>',
        '<think>\nPlan.\n</think>\n\n<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>',
        'Unclosed <tool_call>\n{"name": "run", "arguments": {"command": "ls"}}\n</tool_call></think>after',
        "Talking about <tool_ tags",
    ]


def _r1_reasoning_hand() -> list[str]:
    return [
        "Let me see.\n</think>\n\nIt is 4.",
        "<think>Hm</think>4",
        "Unclosed thinking, all of it",
        "<think>Unclosed with its tag",
        "</think>Only content",
        "",
        "one</think>two</think>three",
        "<think>\n</think>\n\n",
    ]


PARSERS: dict[str, tuple[Callable[[], list[str]], Callable[[random.Random], str]]] = {
    "hermes": (_hermes_hand, _tagged(hermes_call)),
    "qwen3_coder": (_qwen3_coder_hand, _tagged(qwen3_coder_call)),
    "llama3_json": (_llama3_hand, _llama3_draw),
    "mistral": (_mistral_hand, _mistral_draw),
    # Tokenizer v11 and later (an [ARGS] token): NAME[ARGS]{...} after each [TOOL_CALLS].
    "mistral_v11": (_mistral_v11_hand, _mistral_v11_draw),
    "glm45": (_glm45_hand, _tagged(glm45_call)),
    "kimi_k2": (_kimi_hand, _kimi_draw),
    "deepseek_v31": (_v31_hand, _v31_draw),
    "openai": (_harmony_hand, _harmony_draw),
    "reasoning-qwen3": (_qwen3_reasoning_hand, _reasoning_draw(False)),
    # Qwen3's reasoning and its calls in one answer: --reasoning-parser qwen3 with a tool parser.
    "qwen3-hermes": (
        lambda: _qwen3_tools_hand(hermes_call(random.Random(0), "get_weather", {"city": "Paris"})),
        _qwen3_tools_draw(hermes_call),
    ),
    "qwen3-xml": (
        lambda: _qwen3_tools_hand(
            qwen3_coder_call(random.Random(0), "get_weather", {"city": "Paris"})
        ),
        _qwen3_tools_draw(qwen3_coder_call),
    ),
    "reasoning-deepseek_r1": (_r1_reasoning_hand, _reasoning_draw(True)),
}


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for parser, (hand, draw) in PARSERS.items():
        rng = random.Random(f"{SEED}-{parser}")
        cases = [("hand", t) for t in hand()] + [("gen", draw(rng)) for _ in range(GENERATED)]
        lines = [
            json.dumps(
                {"id": f"{parser}-{i:03d}", "source": source, "text": text}, ensure_ascii=False
            )
            for i, (source, text) in enumerate(cases)
        ]
        (OUT / f"{parser}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
