"""The engine's chat answer as an Anthropic Messages response: stream events and the message.

Content blocks, in the engine's order:
* reasoning -> `thinking` (streamed as `thinking_delta`), then a `signature_delta` carrying the
  call's signed handle before its `content_block_stop`. When the request enabled thinking
  (`enabled`/`adaptive`, as Claude Code does) and the engine did not reason, an empty thinking
  block still carries the handle, so every answer can be restored;
* text -> `text` (`text_delta`);
* each tool call -> `tool_use` (`id` = the engine's id when it is a valid Anthropic id, else
  `toolu_<call>_<n>`), its arguments as one `input_json_delta`; arguments that are not a JSON
  object reach the client as `{}` and the call is noted.

Events: `message_start` (usage.input_tokens = prompt tokens when the engine reported them
first), per block `content_block_start`/`_delta`/`_stop` with increasing `index`,
`message_delta` (stop_reason: stop -> `end_turn`, or `stop_sequence` with the matched
sequence; tool_calls -> `tool_use`; length -> `max_tokens`; content_filter -> `refusal`;
cumulative usage) and `message_stop`; `event: error` when the engine fails mid-answer.
"""

from __future__ import annotations

import re
from typing import Any

from ..recall import EngineTurn
from .blocks import Close, Delta, Event, Open, Tool
from .dialect import Answer, AnswerEnd
from .history import dumps, parsed

_SAFE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


class MessagesRenderer:
    def __init__(self, request: dict[str, Any], answer: Answer) -> None:
        self._answer = answer
        thinking = request.get("thinking") or {}
        self._carrier = thinking.get("type") in ("enabled", "adaptive")
        self._stop_sequences = request.get("stop_sequences") or []
        self._content: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._handed = False
        self._tools = 0
        self.notes: list[str] = []
        self._message: dict[str, Any] = {
            "id": f"msg_{answer.call_id}",
            "type": "message",
            "role": "assistant",
            "model": request.get("model"),
            "content": self._content,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }

    def start(self, prompt_tokens: int) -> list[dict[str, Any]]:
        self._message["usage"] = {"input_tokens": prompt_tokens, "output_tokens": 0}
        return [{"type": "message_start", "message": self._snapshot()}]

    def feed(self, events: list[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for event in events:
            if isinstance(event, Open):
                if event.kind == "text" and self._carrier and not self._handed:
                    out += self._empty_thinking()
                out += self._open_block(event.kind)
            elif isinstance(event, Delta):
                out.append(self._delta(event.text))
            elif isinstance(event, Close):
                out += self._close_block()
            elif isinstance(event, Tool):
                if self._carrier and not self._handed:
                    out += self._empty_thinking()
                out += self._tool_block(event)
        return out

    def finish(self, ending: AnswerEnd) -> list[dict[str, Any]]:
        out = self._close_block() if self._open is not None else []
        if self._carrier and not self._handed:
            out += self._empty_thinking()
        reason = _STOP.get(ending.finish_reason or "stop", "end_turn")
        if ending.finish_reason == "content_filter":
            reason = "refusal"
        if self._tools and reason == "end_turn":
            reason = "tool_use"
        sequence = None
        if isinstance(ending.stop_reason, str) and ending.stop_reason in self._stop_sequences:
            reason, sequence = "stop_sequence", ending.stop_reason
        usage = {"input_tokens": ending.prompt_tokens, "output_tokens": ending.completion_tokens}
        self._message.update(stop_reason=reason, stop_sequence=sequence, usage=usage)
        return [
            *out,
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": dict(usage),
            },
            {"type": "message_stop"},
        ]

    def fail(self, message: str, code: str | None) -> list[dict[str, Any]]:
        out = self._close_block() if self._open is not None else []
        return [*out, {"type": "error", "error": {"type": "api_error", "message": message}}]

    def result(self) -> dict[str, Any]:
        return self._snapshot()

    def _open_block(self, kind: str) -> list[dict[str, Any]]:
        index = len(self._content)
        if kind == "reasoning":
            block: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
        else:
            block = {"type": "text", "text": ""}
        self._content.append(block)
        self._open = {"block": block, "index": index}
        return [{"type": "content_block_start", "index": index, "content_block": dict(block)}]

    def _delta(self, text: str) -> dict[str, Any]:
        assert self._open is not None
        block = self._open["block"]
        if block["type"] == "thinking":
            block["thinking"] += text
            delta = {"type": "thinking_delta", "thinking": text}
        else:
            block["text"] += text
            delta = {"type": "text_delta", "text": text}
        return {"type": "content_block_delta", "index": self._open["index"], "delta": delta}

    def _close_block(self) -> list[dict[str, Any]]:
        assert self._open is not None
        opened, self._open = self._open, None
        out: list[dict[str, Any]] = []
        if opened["block"]["type"] == "thinking":
            opened["block"]["signature"] = self._answer.handle
            self._handed = True
            delta = {"type": "signature_delta", "signature": self._answer.handle}
            out.append({"type": "content_block_delta", "index": opened["index"], "delta": delta})
        out.append({"type": "content_block_stop", "index": opened["index"]})
        return out

    def _empty_thinking(self) -> list[dict[str, Any]]:
        return self._open_block("reasoning") + self._close_block()

    def _tool_block(self, call: Tool) -> list[dict[str, Any]]:
        index = len(self._content)
        if call.engine_id and _SAFE_ID.fullmatch(call.engine_id):
            tool_id = call.engine_id
        else:
            tool_id = f"toolu_{self._answer.call_id}_{call.index}"
        self._tools += 1
        value = parsed(call.arguments) if call.arguments.strip() else {}
        if not isinstance(value, dict):
            self.notes.append(f"tool call {call.index}: arguments not a JSON object; sent as {{}}")
            value = {}
        arguments = call.arguments if value and call.arguments.strip() else dumps(value)
        block = {"type": "tool_use", "id": tool_id, "name": call.name, "input": value}
        self._content.append(block)
        return [
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {**block, "input": {}},
            },
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": arguments},
            },
            {"type": "content_block_stop", "index": index},
        ]

    def _snapshot(self) -> dict[str, Any]:
        return {**self._message, "content": [dict(b) for b in self._content]}


def recorded_turn(body: bytes, choice: int) -> EngineTurn | None:
    """A recorded Messages body, rebuilt as the engine's message (see recall.py)."""
    doc = parsed(body.decode(errors="replace"))
    if not isinstance(doc, dict) or choice != 0:
        return None
    reasoning: list[str] = []
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in doc.get("content") or ():
        kind = block.get("type")
        if kind == "thinking":
            reasoning.append(block.get("thinking") or "")
        elif kind == "text":
            text.append(block.get("text") or "")
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {
                        "name": block.get("name"),
                        "arguments": dumps(block.get("input") or {}),
                    },
                }
            )
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(text) if text or not calls else None,
    }
    if any(reasoning):
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return EngineTurn(message)
