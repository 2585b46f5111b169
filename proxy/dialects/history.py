"""A harness's history of assistant turns, restored to the messages the engine produced.

A client dialect splits one engine answer into pieces (reasoning items or thinking blocks, text,
tool calls) and the harness sends them back on every turn. Each piece list becomes one chat
assistant message. When the turn carries a valid handle (see handles.py) to an answer of this
rollout and the harness sent that answer back unchanged in substance (same text, same calls with
equal arguments, reasoning equal or left out), the engine's own message goes to the engine: its
reasoning text, argument spelling and tool-call ids exactly as produced. Otherwise the message is
built from what the harness sent, and the call is noted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..handles import Handle, HandleCheck, Handles
from ..recall import EngineTurn


@dataclass(frozen=True)
class ToolUse:
    client_id: str
    name: str
    """The chat function name (namespaced Responses tools are already flattened)."""
    arguments: str
    """The arguments as JSON text: as sent, or serialized from the object the client holds."""


@dataclass
class HarnessTurn:
    """One assistant turn as the harness sent it back."""

    token: str | None = None
    """The opaque reference the turn carried (a signature, encrypted_content), if any."""
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[ToolUse] = field(default_factory=list)

    @property
    def started(self) -> bool:
        return bool(self.text or self.calls)


def dumps(value: Any) -> str:
    """Canonical argument text: what vLLM's, SGLang's and rolltap's engine tool parsers write."""
    return json.dumps(value, ensure_ascii=False)


def parsed(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def engine_message(message: dict[str, Any]) -> dict[str, Any]:
    """The fields of an engine's assistant message that a chat template reads."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    for key in ("reasoning", "reasoning_content"):
        if message.get(key) is not None:
            out[key] = message[key]
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": c.get("type") or "function",
                "function": {
                    "name": (c.get("function") or {}).get("name"),
                    "arguments": (c.get("function") or {}).get("arguments"),
                },
            }
            for c in calls
        ]
    return out


def reasoning_of(message: dict[str, Any]) -> str | None:
    value = message.get("reasoning")
    if value is None:
        value = message.get("reasoning_content")
    return value if isinstance(value, str) else None


class Restorer:
    """Builds the assistant messages of one request, in order, and maps client tool ids."""

    def __init__(self, rollout_id: str, handles: Handles) -> None:
        self._rollout_id = rollout_id
        self._handles = handles
        self._recalled: dict[Handle, EngineTurn] = {}
        self.engine_ids: dict[str, str] = {}
        """Client tool-call id -> the id the engine gave that call."""
        self.notes: list[str] = []

    def valid_handles(self, turns: Iterable[HarnessTurn]) -> list[Handle]:
        found = []
        for turn in turns:
            verdict, handle = self._handles.read(turn.token, self._rollout_id)
            if verdict is HandleCheck.VALID and handle is not None:
                found.append(handle)
        return found

    def recalled(self, answers: dict[Handle, EngineTurn]) -> None:
        self._recalled = answers

    def message(self, turn: HarnessTurn, position: int) -> dict[str, Any]:
        """The chat message for assistant turn `position` (counted from 1 in the request)."""
        engine = self._engine_turn(turn, position)
        if engine is not None and _same_turn(turn, engine):
            calls = engine.message.get("tool_calls") or []
            for use, call in zip(turn.calls, calls, strict=True):
                self.engine_ids[use.client_id] = str(call.get("id") or use.client_id)
            return dict(engine.message)
        if engine is not None:
            self.notes.append(
                f"assistant turn {position} differs from the answer its reference names; "
                "sent as the harness wrote it"
            )
        return harness_message(turn)

    def tool_call_id(self, client_id: str) -> str:
        return self.engine_ids.get(client_id, client_id)

    def _engine_turn(self, turn: HarnessTurn, position: int) -> EngineTurn | None:
        if not turn.token:
            return None
        verdict, handle = self._handles.read(turn.token, self._rollout_id)
        if verdict is HandleCheck.FOREIGN:
            self.notes.append(f"assistant turn {position}: reference not issued by rolltap")
            return None
        if verdict is HandleCheck.INVALID or handle is None:
            self.notes.append(
                f"assistant turn {position}: reference not honoured (altered, or from another "
                "rollout)"
            )
            return None
        engine = self._recalled.get(handle)
        if engine is None:
            self.notes.append(
                f"assistant turn {position}: referenced call {handle.call_id} not found"
            )
        return engine


def harness_message(turn: HarnessTurn) -> dict[str, Any]:
    text = "".join(turn.text)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text if text or not turn.calls else None,
    }
    reasoning = "".join(turn.reasoning)
    if reasoning:
        # The name vLLM, SGLang and rolltap's engine all read on input.
        message["reasoning_content"] = reasoning
    if turn.calls:
        message["tool_calls"] = [
            {
                "id": use.client_id,
                "type": "function",
                "function": {"name": use.name, "arguments": use.arguments},
            }
            for use in turn.calls
        ]
    return message


def _same_turn(turn: HarnessTurn, engine: EngineTurn) -> bool:
    message = engine.message
    if "".join(turn.text) != (message.get("content") or ""):
        return False
    reasoning = "".join(turn.reasoning)
    if reasoning and reasoning != (reasoning_of(message) or ""):
        return False
    calls = message.get("tool_calls") or []
    if len(calls) != len(turn.calls):
        return False
    for use, call in zip(turn.calls, calls, strict=True):
        function = call.get("function") or {}
        if use.name != function.get("name"):
            return False
        if parsed(use.arguments) != parsed(str(function.get("arguments") or "")):
            return False
    return True
