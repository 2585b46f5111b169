"""Where a call's answer comes from: the engine, or the cassette of a rollout being replayed."""

from __future__ import annotations

from typing import Any

from ..intake import Intake
from ..tokenin.answer import answer_token_in
from .call import EngineCall
from .relay import EngineAnswer


async def engine_answer(taken: Intake, body: dict[str, Any]) -> EngineAnswer:
    """The answer for a call whose chat request is `body`, for every dialect."""
    replay = taken.ctx.replay
    if replay is not None:
        return await replay.answer(taken, body)
    return await live_answer(taken, body)


async def live_answer(taken: Intake, body: dict[str, Any]) -> EngineAnswer:
    """The engine's answer, with token capture (call.py); token-in where the rollout has it."""
    tokenin = taken.ctx.tokenin
    if tokenin is not None and tokenin.enabled(taken.state.token_in):
        return await answer_token_in(tokenin, taken, body)
    return EngineCall(taken.ctx, taken.exchange, body, rollout=taken.state)
