"""What a client dialect provides to the one call flow (serve.py), and the pieces dialects share.

Every dialect is a `Dialect`: Chat Completions (chat.py) checks its request and sends it on as it
came; Responses and Messages are `Translated` (translated.py) from a `Translation`: each parses its
request into a `ChatPlan` (chat parameters plus the conversation, with the harness's assistant
turns left as `HarnessTurn`s until they are restored) and renders the engine's answer through a
`Renderer`, fed with block events (blocks.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ...store import CallDialect
from ..errors import BadRequest
from ..intake import Intake
from ..upstream.relay import EngineAnswer, Rendering
from .blocks import Event
from .history import HarnessTurn

Entry = dict[str, Any] | HarnessTurn
"""A chat message, or an assistant turn still to be restored."""


@dataclass
class ChatPlan:
    params: dict[str, Any]
    """The chat request without its messages."""
    entries: list[Entry]
    notes: list[str] = field(default_factory=list)
    """What the translation left out or changed, recorded on the call."""


@dataclass(frozen=True)
class Answer:
    """Identity of the answer being rendered."""

    call_id: str
    created: int
    handle: str
    """The signed reference to this call's choice 0 (see handles.py)."""


@dataclass(frozen=True)
class AnswerEnd:
    """How an answer ended (why, and its token counts), for the dialect's last event."""

    finish_reason: str | None
    stop_reason: str | int | None
    """vLLM's `stop_reason`: the stop string or token id that ended the answer."""
    prompt_tokens: int
    completion_tokens: int


class Renderer(Protocol):
    """One answer in the client's dialect: stream events as they go, and the whole body."""

    notes: list[str]
    """What the rendering had to change, recorded on the call."""

    def start(self, prompt_tokens: int) -> list[dict[str, Any]]: ...

    def feed(self, events: list[Event]) -> list[dict[str, Any]]: ...

    def finish(self, ending: AnswerEnd) -> list[dict[str, Any]]: ...

    def fail(self, message: str, code: str | None) -> list[dict[str, Any]]: ...

    def result(self) -> dict[str, Any]:
        """The non-streaming body (after `finish`), or what was sent so far."""
        ...


Plan = TypeVar("Plan")


class Dialect(Protocol[Plan]):
    """A client dialect as the call flow sees it; `Plan` is what its request was read into."""

    @property
    def kind(self) -> CallDialect: ...

    def read(self, body: dict[str, Any]) -> Plan:
        """Validate (and translate); raises BadRequest/Unprocessable in the client's terms."""
        ...

    def purpose(self, body: dict[str, Any], headers: Mapping[str, str]) -> str | None:
        """The kind of side call this is (title, compaction, ...), when recognisable."""
        ...

    def notes(self, plan: Plan) -> list[str]:
        """What reading the request left out or changed, recorded on the call."""
        ...

    async def engine_request(self, taken: Intake, plan: Plan) -> dict[str, Any]:
        """The chat completions request the engine is sent (after admission)."""
        ...

    def rendering(self, taken: Intake, body: dict[str, Any]) -> Callable[[EngineAnswer], Rendering]:
        """How the answer will look to this dialect's client (relay.py's `Rendering`)."""
        ...


class Translation(Protocol):
    """A dialect the engine does not speak: its request as a chat plan, its answer rendered."""

    @property
    def kind(self) -> CallDialect: ...

    def plan(self, body: dict[str, Any]) -> ChatPlan:
        """Validate and translate; raises BadRequest/Unprocessable in the client's terms."""
        ...

    def purpose(self, body: dict[str, Any], headers: Mapping[str, str]) -> str | None:
        """The kind of side call this is (title, compaction, ...), when recognisable."""
        ...

    def renderer(self, body: dict[str, Any], answer: Answer) -> Renderer: ...


def expect(body: Mapping[str, Any], key: str, types: type | tuple[type, ...]) -> None:
    """A type check in JSON's terms (a boolean is not a number), naming the field."""
    value = body.get(key)
    if value is None:
        return
    allowed = types if isinstance(types, tuple) else (types,)
    if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
        names = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in allowed)
        raise BadRequest(f"'{key}' must be {names}", param=key, code="invalid_type")


_TYPE_NAMES = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    list: "an array",
    dict: "an object",
}


def sampling(body: Mapping[str, Any], pairs: Mapping[str, str]) -> dict[str, Any]:
    """Copy the sampling fields the client set, renamed to their chat names."""
    return {chat: body[key] for key, chat in pairs.items() if body.get(key) is not None}


def text_parts(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Chat content for a list of chat parts: a plain string when it is a single text."""
    if len(parts) == 1 and parts[0].get("type") == "text":
        return str(parts[0]["text"])
    return parts
