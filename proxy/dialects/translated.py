"""Dialects the engine does not speak (Responses, Messages), as dialects of the one call flow.

`Translated` makes a `Translation` (dialect.py) a `Dialect` for serve.py: the plan's harness
history is restored (history.py) into the chat request the engine is sent, and
`TranslatedRendering` renders the engine's chat answer in the client's dialect event by event.
The record holds the client's request, the chat request sent, and the client's response (the
whole object for streams).

An answer cut by the proxy's own `max_tokens_cap` (the client allowed more, or set no limit) is
shown to the client as ended normally (`completed`, `end_turn`): the cap bounds what a rollout
costs, and both harnesses treat a truncated answer as a failed turn (Codex) or ask for more
(Claude Code). The recorded choice keeps `finish_reason: length` and the call is noted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from ...store import CallDialect
from ..context import ProxyContext
from ..errors import (
    BadRequest,
    Forbidden,
    NotFoundError,
    PayloadTooLarge,
    ProxyError,
    Unauthorized,
    Unprocessable,
)
from ..handles import Handle
from ..intake import Intake
from ..middleware import error_body
from ..recall import EngineTurn
from ..upstream.assemble import ChatAssembler
from ..upstream.call import Chunk, error_message
from ..upstream.exchange import Exchange
from ..upstream.relay import EngineAnswer
from ..upstream.sse import frame
from .blocks import BlockStream, from_message
from .dialect import Answer, AnswerEnd, ChatPlan, Renderer, Translation
from .history import HarnessTurn, Restorer, engine_message

_BY_STATUS: dict[int, type[ProxyError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFoundError,
    413: PayloadTooLarge,
    422: Unprocessable,
}
_CONTEXT_OVERFLOW = ("maximum context length", "context length is", "prompt is too long")


class Translated:
    """A `Translation` as a dialect of the call flow: its plan restored into a chat request, the
    engine's chat answer rendered by its `Renderer` event by event."""

    def __init__(self, translation: Translation) -> None:
        self._translation = translation
        self.kind = translation.kind

    def read(self, body: dict[str, Any]) -> ChatPlan:
        return self._translation.plan(body)

    def purpose(self, body: dict[str, Any], headers: Mapping[str, str]) -> str | None:
        return self._translation.purpose(body, headers)

    def notes(self, plan: ChatPlan) -> list[str]:
        return plan.notes

    async def engine_request(self, taken: Intake, plan: ChatPlan) -> dict[str, Any]:
        return await chat_request(taken.ctx, taken.state.id, plan, taken.exchange)

    def rendering(
        self, taken: Intake, body: dict[str, Any]
    ) -> Callable[[EngineAnswer], TranslatedRendering]:
        exchange = taken.exchange
        handle = taken.ctx.recall.handles.mint(taken.state.id, exchange.call_id)
        renderer = self._translation.renderer(
            body, Answer(exchange.call_id, int(time.time()), handle)
        )
        anthropic = self.kind is CallDialect.MESSAGES
        return lambda answer: TranslatedRendering(taken, answer, renderer, anthropic)


async def chat_request(
    ctx: ProxyContext, rollout_id: str, plan: ChatPlan, exchange: Exchange | None = None
) -> dict[str, Any]:
    """The plan's chat request, the harness's assistant turns restored where they can be."""
    restorer = Restorer(rollout_id, ctx.recall.handles)
    turns = [e for e in plan.entries if isinstance(e, HarnessTurn)]
    wanted = list(dict.fromkeys(restorer.valid_handles(turns)))
    if wanted:
        restorer.recalled(await ctx.recall.lookup(rollout_id, wanted))
    messages: list[dict[str, Any]] = []
    position = 0
    for entry in plan.entries:
        if isinstance(entry, HarnessTurn):
            position += 1
            messages.append(restorer.message(entry, position))
        elif entry.get("role") == "tool":
            messages.append({**entry, "tool_call_id": restorer.tool_call_id(entry["tool_call_id"])})
        else:
            messages.append(entry)
    if exchange is not None:
        exchange.notes.extend(restorer.notes)
    params = dict(plan.params)
    head = {"model": params.pop("model")} if "model" in params else {}
    return {**head, "messages": messages, **params}


def engine_refusal(status: int, message: str, anthropic: bool) -> ProxyError:
    """The engine's own error status and message, as this proxy's error for the client."""
    error = _BY_STATUS.get(status, ProxyError)(message)
    error.status = status
    if any(marker in message for marker in _CONTEXT_OVERFLOW):
        # The words each harness looks for to compact its history and try again.
        error.code = "context_length_exceeded"
        if anthropic and not message.startswith("prompt is too long"):
            error.message = f"prompt is too long: {message}"
    return error


class TranslatedRendering:
    """The engine's chat answer rendered event by event in the client's dialect."""

    def __init__(
        self, taken: Intake, call: EngineAnswer, renderer: Renderer, anthropic: bool
    ) -> None:
        self._taken = taken
        self._exchange = taken.exchange
        self._call = call
        self._renderer = renderer
        self._anthropic = anthropic
        self._blocks = BlockStream()
        self._assembler = ChatAssembler(keep_logprobs=False)
        self._started = False
        self._finish: Any = None
        self._stop: Any = None

    def refused(self, status: int, body: bytes) -> bytes:
        error = engine_refusal(status, error_message(body), self._anthropic)
        return error_body(error, self._anthropic)

    def whole(self, raw: bytes, doc: dict[str, Any]) -> bytes:
        renderer = self._renderer
        choice = _choice(doc)
        message = choice.get("message") or {}
        renderer.start(self._exchange.prompt_tokens)
        renderer.feed(from_message(message))
        renderer.finish(self._ending(choice.get("finish_reason"), choice.get("stop_reason")))
        self._exchange.notes.extend(renderer.notes)
        _remember(self._taken, message)
        return orjson.dumps(renderer.result())

    def feed(self, chunk: Chunk) -> bytes:
        events = self._start()
        doc = chunk.doc
        self._assembler.feed(doc)
        for c in doc.get("choices") or ():
            if int(c.get("index") or 0) != 0:
                continue
            events += self._renderer.feed(self._blocks.feed(c.get("delta") or {}))
            self._finish = c.get("finish_reason") or self._finish
            if c.get("stop_reason") is not None:
                self._stop = c["stop_reason"]
        return _frames(events) if events else b""

    def ending(self) -> bytes:
        renderer = self._renderer
        events = self._start() + renderer.feed(self._blocks.finish())
        events += renderer.finish(self._ending(self._finish, self._stop))
        self._exchange.notes.extend(renderer.notes)
        choices = self._assembler.result()["choices"]
        _remember(self._taken, choices[0]["message"] if choices else {})
        return _frames(events)

    def failure(self) -> bytes:
        return _frames(self._start() + self._renderer.fail("the backend failed mid-stream", None))

    def recorded(self) -> bytes:
        return orjson.dumps(self._renderer.result())

    def _start(self) -> list[dict[str, Any]]:
        """The opening events, before the first chunk's (its prompt ids give the usage)."""
        if self._started:
            return []
        self._started = True
        return self._renderer.start(self._exchange.prompt_tokens)

    def _ending(self, finish: Any, stop: Any) -> AnswerEnd:
        exchange = self._exchange
        usage = exchange.answer.usage or {}
        if finish == "length" and self._call.capped:
            exchange.notes.append("cut at max_tokens_cap; the client was told the answer ended")
            finish = "stop"
        return AnswerEnd(
            finish_reason=finish if isinstance(finish, str) else None,
            stop_reason=stop if isinstance(stop, str | int) else None,
            prompt_tokens=exchange.prompt_tokens or int(usage.get("prompt_tokens") or 0),
            completion_tokens=exchange.completion_tokens
            or int(usage.get("completion_tokens") or 0),
        )


def _frames(events: list[dict[str, Any]]) -> bytes:
    return b"".join(frame(orjson.dumps(e), e["type"]) for e in events)


def _choice(doc: dict[str, Any]) -> dict[str, Any]:
    for choice in doc.get("choices") or ():
        if isinstance(choice, dict) and int(choice.get("index") or 0) == 0:
            return choice
    return {}


def _remember(taken: Intake, message: dict[str, Any]) -> None:
    turn = EngineTurn(engine_message(message))
    taken.ctx.recall.remember(taken.state.id, Handle(taken.exchange.call_id, 0), turn)
