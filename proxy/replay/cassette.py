"""A rollout's recorded calls, served back to a harness that runs its task again.

A proxy given a cassette as its answer source (proxy/answers.py; `rolltap replay`)
answers every call of its rollouts from it instead of an engine. Which recorded call answers a
request:

- the recorded calls are those the engine was asked: `rejected` calls are left out (the proxy
  refuses such a request again by itself, before it reaches the cassette), and so are
  `cancelled` ones (the harness gave up on them; what it waited for next is the following call,
  a retry with the same body when it retried);
- a `failed` call is replayed as the engine refusing with its recorded status and message, so a
  harness's retry after it meets the recorded retry;
- calls are matched within a lane: main calls in one, each kind of side call (`purpose`: a
  title, a compaction, a sub-agent) in its own, so a side call racing the main loop is matched
  against its own kind; within a lane, the n-th request gets the n-th recorded call (in the
  order they were received: seq order for a harness that waits for each answer);
- the request is compared with the recorded one after normalization (normalize.py); a
  difference is a divergence, reported with a message-level diff (diff.py).

What a divergence does depends on the mode: a plain replay keeps serving the recorded answers
(a diverged call's answer without token ids, which belong to another prompt) and reports every
call; `until-divergence` refuses the diverged call and every later one (403 `replay_diverged`,
`replay_stopped`: SDKs do not retry a 403, so the harness ends); `continue-live` sends the
diverged call and every later one to the engine (`live`), a counterfactual continuation.
A request beyond the record is `extra`: refused, or live in `continue-live`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from ...audit.replay import CallReplay, Divergence, Mode, Outcome, Served
from ...store import CallDialect, CallStatus, RolloutView, Store
from ..dialects import messages_render, responses_render
from ..errors import Forbidden, ProxyError
from ..intake import Intake
from ..recall import RecordedTurn
from ..upstream.call import Chunk, EngineError
from ..upstream.engines import EngineKind, Prepared, prepare_chat
from ..upstream.relay import EngineAnswer
from .diff import divergence
from .normalize import Normalizer
from .recorded import RecordedAnswer, RecordedCall, recorded_call

Live = Callable[[Intake, dict[str, Any]], Awaitable[EngineAnswer]]
"""How a call reaches the engine when the replay goes live."""

_TURNS: dict[CallDialect, RecordedTurn] = {
    CallDialect.RESPONSES: responses_render.recorded_turn,
    CallDialect.MESSAGES: messages_render.recorded_turn,
}
_LEFT_OUT = (CallStatus.REJECTED, CallStatus.CANCELLED)


class Cassette:
    def __init__(
        self,
        original: RolloutView,
        calls: Iterable[RecordedCall],
        *,
        mode: Mode = Mode.REPLAY,
        normalizer: Normalizer | None = None,
        live: Live | None = None,
    ) -> None:
        if mode is Mode.CONTINUE_LIVE and live is None:
            raise ValueError("continue-live needs a way to the engine")
        self.original = original
        self.mode = mode
        self._normalizer = normalizer or Normalizer([original.batch_id])
        self._live = live
        self._lanes: dict[str, deque[RecordedCall]] = {}
        self._compared: dict[str, Any] = {}
        for recorded in calls:
            self._lanes.setdefault(_lane(recorded.call.purpose), deque()).append(recorded)
            self._compared[recorded.call.id] = self._normalizer.body(recorded.request)
        self._results: list[CallReplay] = []
        self._stopped_at: int | None = None
        self._live_from: int | None = None
        self._source = f"cassette:{original.id}"

    @classmethod
    async def load(
        cls,
        store: Store,
        original_id: str,
        *,
        mode: Mode = Mode.REPLAY,
        batches: Iterable[str | None] = (),
        live: Live | None = None,
    ) -> Cassette:
        """The recorded calls of a rollout, with their bodies and tokens, read once."""
        original = await store.rollout(original_id)
        views = [c for c in await store.calls(original_id) if c.status not in _LEFT_OUT]
        views.sort(key=lambda c: (c.received_at, c.seq))
        tokens = await store.rollout_tokens(original_id)
        calls = []
        for view in views:
            bodies = await store.call_bodies(view.id)
            found = tokens.get(view.id)
            calls.append(recorded_call(view, bodies.request, bodies.response, found, _TURNS))
        normalizer = Normalizer([original.batch_id, *batches])
        return cls(original, calls, mode=mode, normalizer=normalizer, live=live)

    @property
    def goes_live(self) -> bool:
        """Whether a divergence sends calls to an engine (the proxy needs one)."""
        return self.mode is Mode.CONTINUE_LIVE

    @property
    def live_from(self) -> int | None:
        """The position of the first call sent to the engine (continue-live)."""
        return self._live_from

    def results(self) -> list[CallReplay]:
        """Every call the replay made, in order, then the recorded calls it never made."""
        missing = [r for lane in self._lanes.values() for r in lane]
        missing.sort(key=lambda r: r.call.seq)
        tail = [
            CallReplay(
                position=len(self._results) + i,
                lane=_lane(r.call.purpose),
                outcome=Outcome.MISSING,
                served=Served.NOTHING,
                recorded_call=r.call.id,
                recorded_seq=r.call.seq,
            )
            for i, r in enumerate(missing, start=1)
        ]
        return [*self._results, *tail]

    async def answer(self, taken: Intake, body: dict[str, Any]) -> EngineAnswer:
        """Where this call's answer comes from; `body` is the chat request for an engine."""
        exchange = taken.exchange
        position = len(self._results) + 1
        lane = _lane(exchange.asked.purpose)

        def result(outcome: Outcome, served: Served, **more: Any) -> None:
            call = CallReplay(position, lane, outcome, served, replay_call=exchange.call_id, **more)
            self._results.append(call)

        if self._stopped_at is not None:
            result(Outcome.STOPPED, Served.REFUSED)
            return _Refusal(
                body,
                Forbidden(
                    f"the replay stopped at call {self._stopped_at}; not replayed",
                    code="replay_stopped",
                ),
            )
        if self._live_from is not None:
            result(Outcome.LIVE, Served.LIVE)
            return await self._go_live(taken, body)
        queue = self._lanes.get(lane)
        if not queue:
            return await self._diverged(taken, body, position, result, Outcome.EXTRA, None, None)
        recorded = queue.popleft()
        replayed = self._normalizer.body(exchange.asked.body)
        found = divergence(self._compared[recorded.call.id], replayed, exchange.dialect)
        if recorded.call.dialect is not exchange.dialect:
            found = Divergence(
                params=["dialect"],
                summary=f"a {exchange.dialect.value} call where {recorded.call.dialect.value} "
                "was recorded",
            )
        if found is None:
            result(
                Outcome.MATCHED,
                Served.RECORDED,
                recorded_call=recorded.call.id,
                recorded_seq=recorded.call.seq,
            )
            return RecordedAnswer(exchange, body, recorded, self._source)
        return await self._diverged(
            taken, body, position, result, Outcome.DIVERGED, recorded, found
        )

    async def _diverged(
        self,
        taken: Intake,
        body: dict[str, Any],
        position: int,
        result: Callable[..., None],
        outcome: Outcome,
        recorded: RecordedCall | None,
        found: Divergence | None,
    ) -> EngineAnswer:
        more: dict[str, Any] = {"divergence": found}
        if recorded is not None:
            more |= {"recorded_call": recorded.call.id, "recorded_seq": recorded.call.seq}
        if self.mode is Mode.CONTINUE_LIVE:
            self._live_from = position
            result(outcome, Served.LIVE, **more)
            return await self._go_live(taken, body)
        if self.mode is Mode.UNTIL_DIVERGENCE or recorded is None:
            what = "has no further call" if recorded is None else "diverged"
            if self.mode is Mode.UNTIL_DIVERGENCE:
                self._stopped_at = position
            result(outcome, Served.REFUSED, **more)
            detail = f": {found.summary}" if found is not None and found.summary else ""
            code = "replay_diverged" if recorded is not None else "replay_exhausted"
            return _Refusal(body, Forbidden(f"replay call {position} {what}{detail}", code=code))
        result(outcome, Served.RECORDED, **more)
        return RecordedAnswer(taken.exchange, body, recorded, self._source, with_tokens=False)

    async def _go_live(self, taken: Intake, body: dict[str, Any]) -> EngineAnswer:
        assert self._live is not None
        taken.exchange.notes.append("replay went live: answered by the engine")
        return await self._live(taken, body)


def _lane(purpose: str | None) -> str:
    return purpose or "main"


class _Refusal:
    """relay.EngineAnswer that refuses the call before any engine is asked (recorded failed)."""

    capped = False

    def __init__(self, body: dict[str, Any], error: ProxyError) -> None:
        self._prepared = prepare_chat(body, EngineKind.VLLM)
        self._refusal = error
        self.error: EngineError | None = None

    @property
    def prepared(self) -> Prepared:
        return self._prepared

    async def open(self) -> None:
        raise self._refusal

    async def read_body(self) -> tuple[bytes, dict[str, Any]]:
        raise self._refusal

    def chunks(self) -> AsyncIterator[list[Chunk]]:
        raise self._refusal

    def close(self) -> None:
        """Nothing was opened."""
