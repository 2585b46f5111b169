"""Where a call's answer comes from: an `AnswerSource` given to the proxy when it starts. The
engine (token-in where the rollout has it) by default; the cassette of a rollout being replayed
under `rolltap replay` (proxy/replay). The core context knows no source: each app holds the one
it was given under `ANSWERS`."""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from .intake import Intake
from .tokenin.answer import answer_token_in
from .upstream.call import EngineCall
from .upstream.relay import EngineAnswer


class AnswerSource(Protocol):
    async def answer(self, taken: Intake, body: dict[str, Any]) -> EngineAnswer:
        """The answer for a call whose chat request is `body`, for every dialect."""
        ...


class LiveAnswers:
    """The engine's answers."""

    async def answer(self, taken: Intake, body: dict[str, Any]) -> EngineAnswer:
        return await live_answer(taken, body)


LIVE = LiveAnswers()

ANSWERS: web.AppKey[AnswerSource] = web.AppKey("rolltap_answers")
"""The source a proxy app answers from; its TCP and unix-socket apps hold the same one."""


async def engine_answer(request: web.Request, taken: Intake, body: dict[str, Any]) -> EngineAnswer:
    """The answer for a call whose chat request is `body`, from the app's source."""
    return await request.app[ANSWERS].answer(taken, body)


async def live_answer(taken: Intake, body: dict[str, Any]) -> EngineAnswer:
    """The engine's answer, with token capture (upstream/call.py); token-in where the rollout
    has it."""
    tokenin = taken.ctx.tokenin
    if tokenin is not None and tokenin.enabled(taken.state.token_in):
        lineages, store = taken.state.lineages, taken.ctx.store
        return await answer_token_in(tokenin, taken, body, lineages, store)
    return EngineCall(taken, body)
