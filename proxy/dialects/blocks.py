"""An engine's chat answer as the ordered blocks client dialects show: reasoning, text, tool calls.

Reasoning and text stream as they arrive, one block open at a time. Tool calls are held until
the answer ends and then given whole: both dialects frame a call as start, arguments, stop, and a
whole call can be checked before the client acts on it. A non-streaming answer goes through the
same events (`from_message`), so both kinds of response are built by one renderer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["reasoning", "text"]


@dataclass(frozen=True)
class Open:
    kind: Kind


@dataclass(frozen=True)
class Delta:
    text: str


@dataclass(frozen=True)
class Close:
    pass


@dataclass(frozen=True)
class Tool:
    index: int
    engine_id: str | None
    name: str
    arguments: str


Event = Open | Delta | Close | Tool


@dataclass
class _PendingCall:
    engine_id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class BlockStream:
    """Feed the deltas of choice 0, chunk by chunk; `finish()` when the answer ends."""

    def __init__(self) -> None:
        self._open: Kind | None = None
        self._calls: dict[int, _PendingCall] = {}

    def feed(self, delta: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        for key in ("reasoning", "reasoning_content"):
            if delta.get(key):
                self._text("reasoning", delta[key], events)
        if delta.get("content"):
            self._text("text", delta["content"], events)
        for fragment in delta.get("tool_calls") or ():
            call = self._calls.setdefault(int(fragment.get("index") or 0), _PendingCall())
            if fragment.get("id"):
                call.engine_id = fragment["id"]
            function = fragment.get("function") or {}
            if function.get("name"):
                call.name += function["name"]
            if function.get("arguments"):
                call.arguments.append(function["arguments"])
        return events

    def finish(self) -> list[Event]:
        events: list[Event] = []
        if self._open is not None:
            events.append(Close())
            self._open = None
        for index in sorted(self._calls):
            call = self._calls[index]
            events.append(Tool(index, call.engine_id, call.name, "".join(call.arguments)))
        self._calls = {}
        return events

    def _text(self, kind: Kind, text: str, events: list[Event]) -> None:
        if self._open != kind:
            if self._open is not None:
                events.append(Close())
            events.append(Open(kind))
            self._open = kind
        events.append(Delta(text))


def from_message(message: dict[str, Any]) -> list[Event]:
    """The events of a whole (non-streamed) assistant message."""
    stream = BlockStream()
    events = stream.feed(
        {
            "reasoning": message.get("reasoning") or message.get("reasoning_content"),
            "content": message.get("content"),
        }
    )
    for index, call in enumerate(message.get("tool_calls") or ()):
        function = call.get("function") or {}
        events += stream.feed(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call.get("id"),
                        "function": {
                            "name": function.get("name"),
                            "arguments": function.get("arguments"),
                        },
                    }
                ]
            }
        )
    return events + stream.finish()
