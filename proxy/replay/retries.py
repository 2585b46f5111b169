"""A harness's retry is not a new sample.

An SDK retries a request whose answer it never got (its read timed out, the connection dropped
as the answer ended): the same body, with `x-stainless-retry-count` > 0, which intake.link_retry
links to the call it repeats. Sampled again, it would be a second draw of the same turn: a fork
whose first branch is a dead end, and tokens spent twice (verifiers#2036). Instead, when that
call is still being sampled the retry waits for it, and when it was answered (status ok) within
`RETRY_WINDOW` seconds the retry gets its answer: the same tokens and logprobs, played through
the retry's own dialect rendering as a replayed call is (recorded.py), and recorded as a call of
its own (`retry_of` names the first, a note says it was served the first's answer). A retry of a
call that failed or was cancelled (its client left: the engine request was aborted), or of one
answered longer ago, is sampled anew. Equal bodies without the retry header are new samples:
resampling the same prompt is legitimate.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from ...store import CallDialect, CallStatus
from ..answers import AnswerSource
from ..dialects import messages_render, responses_render
from ..intake import Intake
from ..recall import RecordedTurn
from ..upstream.relay import EngineAnswer
from .recorded import RecordedAnswer, recorded_call

RETRY_WINDOW = 600.0
"""Seconds after its first call's answer in which a retry gets that answer."""

_TURNS: dict[CallDialect, RecordedTurn] = {
    CallDialect.RESPONSES: responses_render.recorded_turn,
    CallDialect.MESSAGES: messages_render.recorded_turn,
}


class RetriesServed:
    """An AnswerSource: `inner`'s answers, but a retry gets its first call's answer."""

    def __init__(self, inner: AnswerSource, window: float = RETRY_WINDOW) -> None:
        self._inner = inner
        self._window = window

    async def answer(self, taken: Intake, body: dict[str, Any]) -> EngineAnswer:
        exchange, state = taken.exchange, taken.state
        digest = exchange.body_hash
        if digest is None:
            return await self._inner.answer(taken, body)
        if exchange.retry_of is None or exchange.retry_count == 0:
            state.draws(digest, exchange.call_id)
            return await self._inner.answer(taken, body)
        drawing = state.drawing.get(digest)
        if drawing is not None and drawing[0] == exchange.retry_of:
            with contextlib.suppress(TimeoutError):
                timeout = taken.ctx.settings.read_timeout
                await asyncio.wait_for(asyncio.shield(drawing[1]), timeout)
        found = state.bodies.get(digest)
        answered = state.answered_at.get(digest, 0.0)
        fresh = time.monotonic() - answered <= self._window
        if found is None or found[0] != exchange.retry_of or found[1] != CallStatus.OK.value:
            return await self._inner.answer(taken, body)
        if not fresh:
            return await self._inner.answer(taken, body)
        store = taken.ctx.store
        view = await store.call(found[0])
        bodies = await store.call_bodies(view.id)
        tokens = await store.call_tokens(view.id)
        recorded = recorded_call(view, bodies.request, bodies.response, tokens, _TURNS)
        if recorded.answer is None:
            return await self._inner.answer(taken, body)
        exchange.notes.append(f"a retry of call {view.id}: served its answer, not a new draw")
        return RecordedAnswer(exchange, body, recorded, view.backend or "retry")
