"""One corpus text through rolltap's parser and vLLM's of the same name, compared.

Three ways, each compared as a chat client sees the answer (content, reasoning, and each call's
name and arguments, the arguments compared as the JSON values they parse to, since either side
may space them differently):

- `whole`: the answer read at once (rolltap's `parse_whole`, vLLM's `Parser.parse`);
- `stream`: rolltap pushed one character at a time, vLLM one token at a time (the finest
  either ever streams; vLLM's streaming parsers read token ids, so its deltas are whole tokens);
- `chunks`: rolltap pushed random runs of 1-12 characters, vLLM random runs of 1-8 tokens.

A streamed answer is its deltas added up: the content and reasoning pieces joined, and each
call's argument fragments joined, so a stream agrees only when its fragments add up to the
arguments of the same call in the whole answer.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rolltap.chatformat.parse import AnswerParser, Delta, thinking_of
from tests.contract import vllm_parsing

CORPUS = Path(__file__).parent / "corpus"
MODES = ("whole", "stream", "chunks")

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
    },
    {
        "type": "function",
        "function": {
            "name": "run",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "filters": {"type": "object"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}},
]


HARMONY = "harmony"


@dataclass(frozen=True)
class Suite:
    """A corpus file and the parsers, named alike on both sides, it is read with."""

    name: str
    corpus: str
    tool: str | None
    """The --tool-call-parser (None: a reasoning corpus, read without tools)."""
    reasoning: str | None
    family: str
    """Whose special tokens the tokenizer is given (vllm_parsing.SPECIAL_TOKENS)."""
    prompt: str = "<|im_start|>assistant\n"
    template_kwargs: tuple[tuple[str, Any], ...] = ()
    """The request's chat_template_kwargs (vLLM gives them to its parsers)."""


SUITES = {
    s.name: s
    for s in [
        Suite("hermes", "hermes", "hermes", None, "hermes"),
        Suite("qwen3_coder", "qwen3_coder", "qwen3_coder", None, "qwen3_coder"),
        # Qwen3.5/3.6 write the same XML calls; vLLM names the parser for them qwen3_xml.
        Suite("qwen3_xml", "qwen3_coder", "qwen3_xml", None, "qwen3_xml"),
        Suite("llama3_json", "llama3_json", "llama3_json", None, "llama3_json"),
        Suite("mistral", "mistral", "mistral", None, "mistral"),
        # A tokenizer with [ARGS] is v11 to vLLM's mistral parser (`_is_pre_v11_tokeniser`).
        Suite("mistral_v11", "mistral_v11", "mistral", None, "mistral_v11"),
        Suite("glm45", "glm45", "glm45", None, "glm45"),
        Suite("kimi_k2", "kimi_k2", "kimi_k2", None, "kimi_k2"),
        Suite("deepseek_v31", "deepseek_v31", "deepseek_v31", None, "deepseek_v31"),
        Suite("reasoning-qwen3", "reasoning-qwen3", None, "qwen3", "qwen3"),
        # Thinking off reads only `enable_thinking` in vLLM's qwen3; `thinking` is not its key.
        Suite("reasoning-qwen3-off", "reasoning-qwen3", None, "qwen3", "qwen3",
              template_kwargs=(("enable_thinking", False),)),
        Suite("reasoning-qwen3-thinking-key", "reasoning-qwen3", None, "qwen3", "qwen3",
              template_kwargs=(("thinking", False),)),
        Suite(
            "reasoning-deepseek_r1",
            "reasoning-deepseek_r1",
            None,
            "deepseek_r1",
            "deepseek_r1",
            prompt="<|im_start|>assistant\n<think>\n",
        ),
        # Qwen3's reasoning parser and a tool parser, chained as vLLM's chat route chains them.
        Suite("reasoning-qwen3+hermes", "qwen3-hermes", "hermes", "qwen3", "qwen3_tools"),
        Suite("reasoning-qwen3+qwen3_xml", "qwen3-xml", "qwen3_xml", "qwen3", "qwen3_tools"),
        Suite("reasoning-qwen3+hermes-off", "qwen3-hermes", "hermes", "qwen3", "qwen3_tools",
              template_kwargs=(("enable_thinking", False),)),
        Suite("reasoning-qwen3+qwen3_xml-off", "qwen3-xml", "qwen3_xml", "qwen3", "qwen3_tools",
              template_kwargs=(("enable_thinking", False),)),
        # DeepSeek-V3.1 thinks only when asked (`thinking: true`), then as R1; else all content.
        Suite(
            "reasoning-deepseek_v3",
            "reasoning-deepseek_r1",
            None,
            "deepseek_v3",
            "deepseek_v31",
            prompt="<|im_start|>assistant\n<think>\n",
            template_kwargs=(("thinking", True),),
        ),
        Suite("reasoning-deepseek_v3-off", "reasoning-deepseek_r1", None, "deepseek_v3",
              "deepseek_v31"),
        # gpt-oss: Harmony messages, read from their token ids by openai-harmony on each side.
        Suite("openai", "openai", "openai", "openai_gptoss", HARMONY),
    ]
}  # fmt: skip


def cases(corpus: str) -> list[dict[str, str]]:
    lines = (CORPUS / f"{corpus}.jsonl").read_text(encoding="utf-8").split("\n")
    return [json.loads(line) for line in lines if line.strip()]


@dataclass(frozen=True)
class Answer:
    """An answer as compared: content, reasoning, calls (name, arguments value)."""

    content: str
    reasoning: str
    calls: tuple[tuple[str, str], ...]

    def describe(self) -> str:
        return json.dumps(
            {"content": self.content, "reasoning": self.reasoning, "calls": self.calls},
            ensure_ascii=False,
        )


def _value(arguments: str) -> str:
    """Arguments as a canonical JSON text. A call cut before its arguments end (both sides
    leave it with what was sent) is read as far as it goes, by vLLM's own partial-JSON reader
    (`partial_json_parser`, a dependency of vLLM), marked `partial:`; text that is no JSON even
    so stays as it is."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, ensure_ascii=False)
    except ValueError:
        pass
    import partial_json_parser

    try:
        found = partial_json_parser.loads(arguments)
    except Exception:  # its errors share no base class but Exception
        return arguments
    return "partial:" + json.dumps(found, sort_keys=True, ensure_ascii=False)


def _answer(content: str, reasoning: str, calls: list[tuple[str, str]]) -> Answer:
    return Answer(content, reasoning, tuple((n, _value(a)) for n, a in calls))


def _rolltap_delta(delta: Delta) -> Answer:
    calls = [(c.name or "", c.arguments) for c in delta.calls()]
    return _answer(delta.content, delta.reasoning, calls)


def _harmony_runs(text: str, mode: str, seed: str) -> list[list[int]]:
    """The answer's ids: all at once, one at a time, or in random runs of 1-8."""
    ids = vllm_parsing.harmony_ids(text)
    if mode == "whole":
        return [ids]
    rng = random.Random(seed)
    runs: list[list[int]] = []
    at = 0
    while at < len(ids):
        runs.append(ids[at : at + (1 if mode == "stream" else rng.randint(1, 8))])
        at += len(runs[-1])
    return runs


def rolltap(suite: Suite, text: str, mode: str, seed: str) -> Answer:
    if suite.family == HARMONY:
        answer = AnswerParser(suite.reasoning, suite.tool, TOOLS, stream=mode != "whole")
        out = Delta()
        for run in _harmony_runs(text, mode, seed):
            out.add(answer.push("", run))
        out.add(answer.finish())
        return _rolltap_delta(answer.settle(out) if mode == "whole" else out)
    thinking = thinking_of(dict(suite.template_kwargs))
    if mode == "whole":
        whole = AnswerParser(suite.reasoning, suite.tool, TOOLS, stream=False, thinking=thinking)
        out = whole.push(text)
        out.add(whole.finish())
        return _rolltap_delta(whole.settle(out))
    parser = AnswerParser(suite.reasoning, suite.tool, TOOLS, stream=True, thinking=thinking)
    out = Delta()
    rng = random.Random(seed)
    at = 0
    while at < len(text):
        size = 1 if mode == "stream" else rng.randint(1, 12)
        out.add(parser.push(text[at : at + size]))
        at += size
    out.add(parser.finish())
    return _rolltap_delta(out)


def vllm(suite: Suite, text: str, mode: str, seed: str) -> Answer:
    tool, kwargs = suite.tool, dict(suite.template_kwargs)
    if suite.family == HARMONY:
        if mode == "whole":
            parsed = vllm_parsing.harmony_whole(text, TOOLS)
        else:
            parsed = vllm_parsing.harmony_streamed(_harmony_runs(text, mode, seed), TOOLS)
    elif mode == "whole":
        parsed = vllm_parsing.whole(text, tool, suite.reasoning, suite.family, TOOLS, kwargs)
    else:
        pieces = vllm_parsing.token_pieces(text, suite.family)
        deltas = vllm_parsing.chunked(pieces, None if mode == "stream" else random.Random(seed))
        prompt = vllm_parsing.tokenizer(suite.family).encode(suite.prompt, add_special_tokens=False)
        parsed = vllm_parsing.streamed(
            deltas, tool, suite.reasoning, suite.family, TOOLS, prompt, kwargs
        )
    calls = [(c["name"], c["arguments"]) for c in parsed.calls]
    return _answer(parsed.content, parsed.reasoning, calls)


def rolltap_outcome(suite: Suite, text: str) -> str:
    """rolltap's tool_parse of the whole text ("none" without a tool parser)."""
    if suite.family == HARMONY:
        parser = AnswerParser(suite.reasoning, suite.tool, TOOLS, stream=False)
        parser.push("", vllm_parsing.harmony_ids(text))
    else:
        thinking = thinking_of(dict(suite.template_kwargs))
        parser = AnswerParser(suite.reasoning, suite.tool, TOOLS, stream=False, thinking=thinking)
        parser.push(text)
    parser.finish()
    return parser.tool_parse or "none"


def compare(suite: Suite, case: dict[str, str], mode: str) -> tuple[Answer, Answer]:
    seed = f"{case['id']}-{mode}"
    return rolltap(suite, case["text"], mode, seed), vllm(suite, case["text"], mode, seed)
