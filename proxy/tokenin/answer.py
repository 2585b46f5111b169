"""Token-in calls: decide per call whether it continues a lineage, and answer either way.

A call of a token-in rollout whose request continues an earlier answer (lineage.py) is sent to
the engine with the earlier prompt, the sampled ids, the end of turn rolltap adds when that
answer did not end its turn (cut at its token limit; noted on the call), and the bridge
(bridge.py): on its token-in route, the answer parsed back into chat here (route.py), or with
the chat request, parsed by the engine (chatroute.py). Any other call is a normal rendered chat
call, its reason code recorded. Both become a lineage turn once answered, so the next call of
the conversation can continue them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from ...analysis.bridging import BRIDGED, FIRST_TURN
from ...store import Store
from ...store.records import LineageMark
from ..errors import UpstreamUnavailable
from ..upstream.assemble import ChatAssembler
from ..upstream.call import Chunk, EngineCall, EngineError
from ..upstream.engines import EngineKind, Prepared
from ..upstream.leg import Leg
from ..upstream.relay import EngineAnswer
from .bridge import TemplateFailed
from .chatroute import ChatIdsRoute
from .config import TokenIn
from .lineage import (
    ENGINE_RENDERED,
    HISTORY_EDITED,
    MULTIPLE_CHOICES,
    TOKENIZE_FAILED,
    UNSUPPORTED_BACKEND,
    AnsweredTurn,
    Continued,
    Lineages,
    answer_print,
    context_print,
    last_assistant,
    prefix_hashes,
)
from .route import TokenInRoute

log = logging.getLogger("rolltap.proxy")


async def answer_token_in(
    tokenin: TokenIn, taken: Leg, body: dict[str, Any], lineages: Lineages, store: Store
) -> EngineAnswer:
    """The call's answer: token-in when its request continues a lineage, else rendered.
    `lineages`: its rollout's; `store`: where every replica's token-in turns are kept."""
    exchange = taken.exchange
    hashes = prefix_hashes(body["messages"])
    context = context_print(body)
    started = time.perf_counter()
    outcome = await _decide(tokenin, taken, body, hashes, context, lineages, store)
    route = None if isinstance(outcome, str) else outcome
    bridge = BRIDGED if route is not None else str(outcome)
    exchange.bridged(bridge)
    metrics = taken.ctx.metrics
    checked = route if isinstance(route, ChatIdsRoute) else None
    if checked is None:  # a chat-route call counts once its engine's prompt is known
        metrics.token_in.inc(outcome=bridge)
    if route is not None:
        metrics.bridge_seconds.observe(time.perf_counter() - started)
    call = EngineCall(taken, body, route=route)
    return _Remembered(call, taken, lineages, hashes, context, checked)


async def _decide(
    tokenin: TokenIn,
    taken: Leg,
    body: dict[str, Any],
    hashes: list[bytes],
    context: bytes,
    lineages: Lineages,
    store: Store,
) -> TokenInRoute | ChatIdsRoute | str:
    if (body.get("n") or 1) != 1:
        return MULTIPLE_CHOICES
    found = await _find(taken, body["messages"], hashes, context, lineages, store)
    if not isinstance(found, Continued):
        return found
    try:
        backend = taken.ctx.router.pick(taken.exchange.rollout_id)
    except UpstreamUnavailable:
        return UNSUPPORTED_BACKEND  # dispatch then says that no backend could take the call
    if backend.kind is EngineKind.OPENAI:
        return UNSUPPORTED_BACKEND
    turn = found.turn
    model = body.get("model") if isinstance(body.get("model"), str) else None
    bridges = tokenin.bridges(taken.ctx.client(), backend.url, backend.kind, model)
    options = body.get("chat_template_kwargs")
    tools = body.get("tools") or None
    rendered = options if isinstance(options, dict) else None
    last = turn.sampled_ids[-1] if turn.sampled_ids else -1
    cut = turn.finish_reason == "length"
    try:
        closing = await bridges.end_of_turn(last, cut, tools, rendered)
        if isinstance(closing, str):
            return closing
        bridge = await bridges.bridge(closing[-1] if closing else last, found.tail, tools, rendered)
    except TemplateFailed as e:
        log.warning("token-in bridge for call %s: %s", taken.exchange.call_id, e)
        return TOKENIZE_FAILED
    if isinstance(bridge, str):
        return bridge
    if closing:
        # Not sampled: in the next prompt, but never in a call's sampled ids (mask 0).
        ended = "cut at its token limit" if cut else "ended without an end-of-turn token"
        taken.exchange.notes.append(
            f"end of turn {closing} added by rolltap after the answer it continues ({ended})"
        )
    prompt_ids = [*turn.prompt_ids, *turn.sampled_ids, *closing, *bridge]
    if tokenin.route == "chat":
        return ChatIdsRoute(prompt_ids)
    parse_tools = bool(body.get("tools")) and body.get("tool_choice") != "none"
    return TokenInRoute(
        prompt_ids,
        tokenin.reasoning_parser,
        tokenin.tool_call_parser if parse_tools else None,
        body.get("tools"),
    )


async def _find(
    taken: Leg,
    messages: list[dict[str, Any]],
    hashes: list[bytes],
    context: bytes,
    lineages: Lineages,
    store: Store,
) -> Continued | str:
    """The turn the request continues: from this process's memory, else from the store, where
    every token-in call leaves its fingerprints, so a conversation continues on whichever
    replica or worker its next call reaches, and after a restart."""
    found = lineages.find(messages, hashes, context)
    if found not in (FIRST_TURN, HISTORY_EDITED):
        return found
    last = last_assistant(messages)
    if last is None:
        return found
    stored = await store.lineage_turns(taken.exchange.rollout_id, hashes[last])
    if not stored:
        return found
    for turn in reversed(stored):  # oldest first: find() prefers the latest
        recovered = AnsweredTurn(
            prompt_ids=turn.prompt_ids.tolist(),
            sampled_ids=turn.sampled_ids.tolist(),
            finish_reason=turn.finish_reason,
            answer=turn.answer,
            context=turn.context,
        )
        lineages.add(hashes[: last + 1], recovered)
    return lineages.find(messages, hashes, context)


class _Remembered:
    """An engine answer that, once complete, becomes a turn of its lineage."""

    def __init__(
        self,
        call: EngineCall,
        taken: Leg,
        lineages: Lineages,
        hashes: list[bytes],
        context: bytes,
        chat_route: ChatIdsRoute | None = None,
    ) -> None:
        """`chat_route`: the call was sent by the chat route, whose engine may have ignored
        the ids: the prompt it reports is checked."""
        self._call = call
        self._chat_route = chat_route
        self._taken = taken
        self._lineages = lineages
        self._hashes = hashes
        self._context = context
        self.error: EngineError | None = None
        self.capped = call.capped

    @property
    def prepared(self) -> Prepared:
        return self._call.prepared

    async def open(self) -> None:
        await self._call.open()
        self.error = self._call.error

    async def read_body(self) -> tuple[bytes, dict[str, Any]]:
        raw, doc = await self._call.read_body()
        choices = doc.get("choices") or [{}]
        self._remember((choices[0] or {}).get("message") or {})
        return raw, doc

    async def chunks(self) -> AsyncIterator[list[Chunk]]:
        assembler = ChatAssembler(keep_logprobs=False)
        async with contextlib.aclosing(self._call.chunks()) as answer:
            async for batch in answer:
                for chunk in batch:
                    assembler.feed(chunk.doc)
                yield batch
        choices = assembler.result().get("choices") or [{}]
        self._remember(choices[0].get("message") or {})

    def close(self) -> None:
        self._call.close()

    def _remember(self, message: dict[str, Any]) -> None:
        exchange = self._taken.exchange
        captured = exchange.answer.captured
        choice = captured.choices.get(0)
        route = self._chat_route
        if route is not None:
            # A resumed answer's prompt is the ids sent plus the partial answer: not checked.
            if exchange.resumes is None and not route.used_by(captured.prompt_ids):
                exchange.bridged(ENGINE_RENDERED)
                log.warning(
                    "call %s: the engine did not sample from the prompt ids sent with the chat "
                    "request (it rendered the messages); recorded as %s",
                    exchange.call_id,
                    ENGINE_RENDERED,
                )
            self._taken.ctx.metrics.token_in.inc(outcome=exchange.bridge or BRIDGED)
        if captured.prompt_ids is None or choice is None or not choice.has_ids:
            return  # a text-only answer cannot be continued by ids
        turn = AnsweredTurn(
            prompt_ids=list(captured.prompt_ids),
            sampled_ids=list(choice.token_ids),
            finish_reason=choice.finish_reason,
            answer=answer_print(message),
            context=self._context,
        )
        self._lineages.add(self._hashes, turn)
        exchange.remembered(LineageMark(self._hashes[-1], turn.answer, self._context))
