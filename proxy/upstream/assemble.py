"""The non-streaming equivalent of a streamed chat completion, built chunk by chunk."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Choice:
    role: str = "assistant"
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    reasoning_key: str = "reasoning"
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: list[Any] | None = None
    finish_reason: str | None = None


class ChatAssembler:
    def __init__(self, *, keep_logprobs: bool = True) -> None:
        self._keep_logprobs = keep_logprobs
        self._head: dict[str, Any] = {}
        self._choices: dict[int, _Choice] = {}
        self._usage: dict[str, Any] | None = None

    def feed(self, doc: dict[str, Any]) -> None:
        if not self._head:
            self._head = {k: doc[k] for k in ("id", "created", "model") if k in doc}
        if isinstance(doc.get("usage"), dict):
            self._usage = doc["usage"]
        for raw in doc.get("choices") or ():
            choice = self._choices.setdefault(int(raw.get("index") or 0), _Choice())
            delta = raw.get("delta") or {}
            if delta.get("role"):
                choice.role = delta["role"]
            if delta.get("content"):
                choice.content.append(delta["content"])
            for key in ("reasoning", "reasoning_content"):
                if delta.get(key):
                    choice.reasoning.append(delta[key])
                    choice.reasoning_key = key
            for call in delta.get("tool_calls") or ():
                merged = choice.tool_calls.setdefault(
                    int(call.get("index") or 0),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if call.get("id"):
                    merged["id"] = call["id"]
                if call.get("type"):
                    merged["type"] = call["type"]
                function = call.get("function") or {}
                if function.get("name"):
                    merged["function"]["name"] += function["name"]
                if function.get("arguments"):
                    merged["function"]["arguments"] += function["arguments"]
            logprobs = raw.get("logprobs") if self._keep_logprobs else None
            if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
                choice.logprobs = (choice.logprobs or []) + logprobs["content"]
            if raw.get("finish_reason") is not None:
                choice.finish_reason = raw["finish_reason"]

    def result(self) -> dict[str, Any]:
        choices = []
        for index in sorted(self._choices):
            c = self._choices[index]
            message: dict[str, Any] = {"role": c.role, "content": "".join(c.content) or None}
            if c.reasoning:
                message[c.reasoning_key] = "".join(c.reasoning)
            if c.tool_calls:
                message["tool_calls"] = [c.tool_calls[k] for k in sorted(c.tool_calls)]
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "logprobs": None if c.logprobs is None else {"content": c.logprobs},
                    "finish_reason": c.finish_reason,
                }
            )
        out: dict[str, Any] = {**self._head, "object": "chat.completion", "choices": choices}
        if self._usage is not None:
            out["usage"] = self._usage
        return out
