"""Recorded request and response bodies, in any dialect, as one comparable list of turns.

Drift classification compares what a call's conversation was (its request plus the answer the
harness received) with what the next call sent. Chat Completions, Responses and Anthropic Messages
spell the same things differently; this module reduces each to `ConversationTurn`s so the
comparison is one piece of code. Only what a chat template renders is kept (roles, text,
reasoning, tool calls); ids, cache hints and signatures are dropped, so they never count as drift.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..store.models import CallDialect

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str
    """As the wire carried it: the JSON text for chat and Responses, canonical JSON for dicts."""


@dataclass(frozen=True)
class ConversationTurn:
    role: str
    """system, user, assistant or tool."""
    text: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()


def request_turns(dialect: CallDialect, body: bytes | None) -> list[ConversationTurn] | None:
    """The conversation a client sent, or None when the body is missing or not understood."""
    data = _load(body)
    if not isinstance(data, dict):
        return None
    try:
        if dialect is CallDialect.CHAT:
            return [_chat_message(m) for m in data.get("messages") or []]
        if dialect is CallDialect.RESPONSES:
            return _responses_request(data)
        if dialect is CallDialect.MESSAGES:
            return _messages_request(data)
    except (AttributeError, TypeError, KeyError):
        return None
    return None


def response_turns(
    dialect: CallDialect, body: bytes | None, choice: int = 0
) -> list[ConversationTurn] | None:
    """What the client received for one choice: the turns it would append to its history."""
    data = _load(body)
    if not isinstance(data, dict):
        return None
    try:
        if dialect is CallDialect.CHAT:
            for c in data.get("choices") or []:
                if c.get("index", 0) == choice:
                    return [_chat_message({"role": "assistant", **(c.get("message") or {})})]
            return None
        if dialect is CallDialect.RESPONSES:
            return _merge_assistant(list(_response_items(data.get("output") or [])))
        if dialect is CallDialect.MESSAGES:
            return [_anthropic_assistant(data.get("content") or [])]
    except (AttributeError, TypeError, KeyError):
        return None
    return None


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, answer) of a text that carries its reasoning inline, as Qwen3 templates do."""
    if _THINK_CLOSE not in text:
        return None, text
    head, _, tail = text.partition(_THINK_CLOSE)
    reasoning = head.split(_THINK_OPEN, 1)[-1].strip("\n")
    return reasoning, tail.lstrip("\n")


def canonical_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def parsed_arguments(arguments: str) -> Any:
    """The value of a tool call's arguments, or the text itself when it is not JSON."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _load(body: bytes | None) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def _text(content: Any) -> str:
    """Text of a content field that is a string, a list of parts, or absent."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif part.get("type") in ("text", "input_text", "output_text"):
            parts.append(part.get("text") or "")
        elif part.get("type") in ("image_url", "input_image", "image"):
            parts.append("[image]")
    return "".join(parts)


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else canonical_json(value)


def _chat_message(m: dict[str, Any]) -> ConversationTurn:
    role = "system" if m.get("role") == "developer" else str(m.get("role"))
    text = _text(m.get("content"))
    reasoning = m.get("reasoning_content")
    if reasoning is None:
        reasoning = m.get("reasoning")
    if role == "assistant" and reasoning is None:
        reasoning, text = split_reasoning(text)
    calls = tuple(
        ToolCall(str(f.get("name")), _arguments(f.get("arguments") or ""))
        for f in (c.get("function") or {} for c in m.get("tool_calls") or [])
    )
    return ConversationTurn(role, text, reasoning or None, calls)


def _responses_request(data: dict[str, Any]) -> list[ConversationTurn]:
    turns: list[ConversationTurn] = []
    if data.get("instructions"):
        turns.append(ConversationTurn("system", _text(data["instructions"])))
    items = data.get("input")
    if isinstance(items, str):
        return [*turns, ConversationTurn("user", items)]
    return turns + _merge_assistant(list(_response_items(items or [])))


def _response_items(items: Iterable[dict[str, Any]]) -> Iterator[ConversationTurn]:
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item.get("role") == "developer" else str(item.get("role"))
            yield ConversationTurn(role, _text(item.get("content")))
        elif kind == "reasoning":
            texts = [s.get("text") or "" for s in item.get("summary") or []]
            texts += [c.get("text") or "" for c in item.get("content") or []]
            yield ConversationTurn("assistant", reasoning="".join(texts))
        elif kind in ("function_call", "custom_tool_call"):
            raw = item.get("arguments") if kind == "function_call" else item.get("input")
            yield ConversationTurn(
                "assistant", tool_calls=(ToolCall(str(item.get("name")), _arguments(raw)),)
            )
        elif kind in ("function_call_output", "custom_tool_call_output"):
            yield ConversationTurn("tool", _text(item.get("output")))


def _merge_assistant(turns: list[ConversationTurn]) -> list[ConversationTurn]:
    """Adjacent assistant items (reasoning, text, calls) as the one turn a template renders."""
    merged: list[ConversationTurn] = []
    for t in turns:
        last = merged[-1] if merged else None
        if t.role == "assistant" and last is not None and last.role == "assistant":
            reasoning = (last.reasoning or "") + (t.reasoning or "")
            merged[-1] = ConversationTurn(
                "assistant", last.text + t.text, reasoning or None, last.tool_calls + t.tool_calls
            )
        else:
            merged.append(t)
    return merged


def _messages_request(data: dict[str, Any]) -> list[ConversationTurn]:
    turns: list[ConversationTurn] = []
    if data.get("system"):
        turns.append(ConversationTurn("system", _text(data["system"])))
    for m in data.get("messages") or []:
        content = m.get("content")
        if m.get("role") == "assistant":
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            turns.append(_anthropic_assistant(blocks or []))
            continue
        if isinstance(content, str):
            turns.append(ConversationTurn("user", content))
            continue
        text: list[str] = []
        for block in content or []:
            if block.get("type") == "tool_result":
                turns.append(ConversationTurn("tool", _text(block.get("content"))))
            else:
                text.append(_text([block]))
        if text:
            turns.append(ConversationTurn("user", "".join(text)))
    return turns


def _anthropic_assistant(blocks: list[dict[str, Any]]) -> ConversationTurn:
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            text.append(block.get("text") or "")
        elif kind == "thinking":
            reasoning.append(block.get("thinking") or "")
        elif kind == "redacted_thinking":
            reasoning.append("[redacted]")
        elif kind == "tool_use":
            calls.append(ToolCall(str(block.get("name")), _arguments(block.get("input") or {})))
    return ConversationTurn("assistant", "".join(text), "".join(reasoning) or None, tuple(calls))
