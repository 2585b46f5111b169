"""vLLM's parsers driven as its chat route drives them, on CPU, for the parity tests.

vLLM composes a request's tool-call and reasoning parsers into one `Parser`
(`ParserManager.get_parser`, vllm/parser/): `parse` reads a whole answer, `parse_delta` one
streamed delta (its text and token ids, `finished` on the last). The parsers look up their
special tokens in the tokenizer's vocabulary and read token ids while streaming, so they are
given the real SmolLM2 tokenizer with the family's special tokens added (each one token, as in
the family's own tokenizer), and a stream is cut at token boundaries: a delta vLLM sends is
always whole tokens.
"""

from __future__ import annotations

import copy
import functools
import json
import random
from dataclasses import dataclass, field
from typing import Any

from tests.support.chats import smollm2_tokenizer

SPECIAL_TOKENS: dict[str, list[str]] = {
    "hermes": ["<tool_call>", "</tool_call>"],
    "qwen3_coder": ["<tool_call>", "</tool_call>"],
    "qwen3_xml": ["<tool_call>", "</tool_call>"],
    "llama3_json": ["<|python_tag|>", "<|eom_id|>"],
    "mistral": ["[TOOL_CALLS]"],
    "mistral_v11": ["[TOOL_CALLS]", "[ARGS]"],
    "glm45": [
        "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
        "<think>", "</think>",
    ],
    "kimi_k2": [
        "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<think>", "</think>",
    ],
    "deepseek_v31": [
        "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<think>", "</think>",
    ],
    "qwen3": ["<think>", "</think>"],
    "qwen3_tools": ["<think>", "</think>", "<tool_call>", "</tool_call>"],
    "deepseek_r1": ["<think>", "</think>"],
}  # fmt: skip


@functools.cache
def tokenizer(family: str) -> Any:
    """SmolLM2's tokenizer with the family's special tokens added, wrapped as vLLM's serving
    layer wraps every tokenizer it hands its parsers (get_cached_tokenizer: the vocabulary and
    special ids read once; each parser reads the whole vocabulary when it is made)."""
    from vllm.tokenizers.hf import get_cached_tokenizer

    found = copy.deepcopy(smollm2_tokenizer())
    found.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[family]})
    return get_cached_tokenizer(found)


@dataclass
class Parsed:
    """One answer as a chat client gets it: whole, or its deltas added up."""

    content: str = ""
    reasoning: str = ""
    calls: list[dict[str, str]] = field(default_factory=list)
    """Each call's name and arguments string (streamed: its fragments joined)."""
    ids: set[int] = field(default_factory=set)
    """Call indexes that got an id."""

    def add_call_delta(self, index: int, name: str | None, arguments: str | None, id: Any) -> None:
        while len(self.calls) <= index:
            self.calls.append({"name": "", "arguments": ""})
        if name:
            self.calls[index]["name"] += name
        if arguments:
            self.calls[index]["arguments"] += arguments
        if id:
            self.ids.add(index)


def request(tools: list[dict[str, Any]], template_kwargs: dict[str, Any]) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        tools=tools,
        chat_template_kwargs=template_kwargs or None,
    )


def parser_class(tool: str | None, reasoning: str | None, family: str) -> Any:
    from vllm.parser.parser_manager import ParserManager

    return ParserManager.get_parser(
        tool_parser_name=tool,
        reasoning_parser_name=reasoning,
        enable_auto_tools=tool is not None,
        tokenizer=None,
    )


def whole(
    text: str,
    tool: str | None,
    reasoning: str | None,
    family: str,
    tools: list[dict[str, Any]],
    template_kwargs: dict[str, Any],
) -> Parsed:
    req = request(tools, template_kwargs)
    parser = parser_class(tool, reasoning, family)(
        tokenizer(family), req.tools, chat_template_kwargs=template_kwargs
    )
    found_reasoning, content, calls = parser.parse(text, req, enable_auto_tools=tool is not None)
    out = Parsed(content=content or "", reasoning=found_reasoning or "")
    for k, call in enumerate(calls or ()):
        out.add_call_delta(k, call.name, call.arguments, "whole")
    return out


def token_pieces(text: str, family: str) -> list[tuple[str, list[int]]]:
    """The text as vLLM's detokenizer streams it: one (text, [id]) per token (a fresh list
    each call, of the pieces worked out once per text: both stream modes read them)."""
    return [(piece, list(ids)) for piece, ids in _token_pieces(text, family)]


@functools.lru_cache(maxsize=256)
def _token_pieces(text: str, family: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    tok = tokenizer(family)
    ids = tok.encode(text, add_special_tokens=False)
    pieces: list[tuple[str, list[int]]] = []
    shown = ""
    pending: list[int] = []
    for k in range(len(ids)):
        pending.append(ids[k])
        decoded = tok.decode(ids[: k + 1], skip_special_tokens=False)
        if decoded.endswith("\ufffd"):
            continue  # an unfinished UTF-8 sequence: vLLM holds it back too
        pieces.append((decoded[len(shown) :], pending))
        shown, pending = decoded, []
    if pending:
        pieces.append((tok.decode(ids, skip_special_tokens=False)[len(shown) :], pending))
    return tuple((piece, tuple(got)) for piece, got in pieces)


def chunked(
    pieces: list[tuple[str, list[int]]], rng: random.Random | None
) -> list[tuple[str, list[int]]]:
    """Token pieces joined into deltas: one token each (`rng` None) or runs of 1-8 tokens."""
    if rng is None:
        return pieces
    out: list[tuple[str, list[int]]] = []
    at = 0
    while at < len(pieces):
        run = pieces[at : at + rng.randint(1, 8)]
        out.append(("".join(t for t, _ in run), [i for _, ids in run for i in ids]))
        at += len(run)
    return out


def streamed(
    deltas: list[tuple[str, list[int]]],
    tool: str | None,
    reasoning: str | None,
    family: str,
    tools: list[dict[str, Any]],
    prompt_ids: list[int],
    template_kwargs: dict[str, Any],
) -> Parsed:
    req = request(tools, template_kwargs)
    parser = parser_class(tool, reasoning, family)(
        tokenizer(family), req.tools, chat_template_kwargs=template_kwargs
    )
    out = Parsed()
    last = len(deltas) - 1
    for k, (text, ids) in enumerate(deltas or [("", [])]):
        delta = parser.parse_delta(text, list(ids), req, prompt_ids, finished=k >= last)
        if delta is None:
            continue
        out.content += delta.content or ""
        out.reasoning += delta.reasoning or ""
        for call in delta.tool_calls or ():
            function = call.function
            out.add_call_delta(
                call.index,
                None if function is None else function.name,
                None if function is None else function.arguments,
                call.id,
            )
    return out


def arguments_value(arguments: str) -> Any:
    """A call's arguments as the client reads them: JSON, else the text as it is."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


# -- gpt-oss: Harmony, read from token ids -------------------------------------------------------


class HarmonyTokenizer:
    """What vLLM's HarmonyParser asks of a tokenizer: decode (the text of a message it could
    not finish), over gpt-oss's own encoding."""

    def __init__(self) -> None:
        from rolltap.chatformat.harmony import encoding

        self._encoding = encoding()

    def decode(self, ids: list[int], **_: Any) -> str:
        return str(self._encoding.decode(list(ids)))

    def get_vocab(self) -> dict[str, int]:
        return {}


def harmony_ids(text: str) -> list[int]:
    from rolltap.chatformat.harmony import encoding

    return list(encoding().encode(text, allowed_special="all"))


def harmony_parser(tools: list[dict[str, Any]]) -> Any:
    from vllm.parser.parser_manager import ParserManager

    parser_cls = ParserManager.get_parser(
        tool_parser_name="openai",
        reasoning_parser_name="openai_gptoss",
        enable_auto_tools=True,
        is_harmony=True,
    )
    return parser_cls(HarmonyTokenizer(), request(tools, {}).tools)


def harmony_whole(text: str, tools: list[dict[str, Any]]) -> Parsed:
    req = request(tools, {})
    parser = harmony_parser(tools)
    reasoning, content, calls = parser.parse(text, req, True, harmony_ids(text))
    out = Parsed(content=content or "", reasoning=reasoning or "")
    for k, call in enumerate(calls or ()):
        out.add_call_delta(k, call.name, call.arguments, "whole")
    return out


def harmony_streamed(deltas: list[list[int]], tools: list[dict[str, Any]]) -> Parsed:
    req = request(tools, {})
    parser = harmony_parser(tools)
    out = Parsed()
    last = len(deltas) - 1
    for k, ids in enumerate(deltas or [[]]):
        delta = parser.parse_delta("", list(ids), req, [], finished=k >= last)
        if delta is None:
            continue
        out.content += delta.content or ""
        out.reasoning += delta.reasoning or ""
        for call in delta.tool_calls or ():
            function = call.function
            out.add_call_delta(
                call.index,
                None if function is None else function.name,
                None if function is None else function.arguments,
                call.id,
            )
    return out
