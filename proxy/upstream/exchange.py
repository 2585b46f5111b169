"""One request's life in the proxy, and the call record it becomes.

An `Exchange` is fixed at intake (its rollout, dialect, arrival, id and the bytes received) and
goes on in parts, each written by the phase that owns it. A part is immutable and replaced whole
by the method named for what happened; no other module assigns to an Exchange
(tests/proxy/test_exchange_writers.py reads them all to check), so these methods are the whole
list of its writers:

    part                what                                   written by
    asked               the request as its dialect read it     understood(): dialects/serve.py
    terms               what admission allows the engine call  admitted(): intake.admit
    weight_version      the policy version it runs under       runs_under(): relay.py, resume
    dispatch            where and when it was last sent        sent(), tried(): forward.py,
                                                               replay/recorded.py
    answer              the engine's answer as read: ids,      its source, as it reads:
                        usage, times (`Answer`, accumulates)   upstream/call.py, replay/recorded.py
    outcome             how it ended for the client            answered(), fail(), reject():
                                                               relay.py, intake.py
    retry_of, resumes   the call it repeats, or continues      retries(): intake.link_retry;
                                                               continues(): upstream/call.py
    bridge, lineage     token-in (proxy/tokenin/answer.py)     bridged(), remembered()
    notes               said in the record besides the error   appended by any phase
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from ...store import CallDialect, CallRecord, CallStatus, Capture, ChoiceRecord, InvalidTokens
from ...store.ids import body_hash, new_id
from ...store.packing import id_list, logprob_list
from ...store.records import LineageMark, WeightSpans
from ..errors import ProxyError
from . import routed
from .engines import Captured

RETRY_HEADER = "x-stainless-retry-count"
# Headers by which harnesses name side calls (title generation, compaction, sub-agents).
PURPOSE_HEADERS = ("x-rolltap-purpose", "x-openai-subagent")


def now() -> datetime:
    return datetime.now(UTC)


# The parts below are NamedTuples: immutable, so a part is only ever replaced whole by the
# Exchange's methods, and at about 3.5 K instructions half a frozen dataclass's cost to build
# (four are built in a call).


class Asked(NamedTuple):
    """The request as its dialect read it; before that (a request refused unread) only the
    purpose its headers named."""

    body: dict[str, Any] | None = None
    stream: bool = False
    model: str | None = None
    purpose: str | None = None


class Terms(NamedTuple):
    """What admission (proxy/intake.py) decided the engine call may be."""

    served_model: str | None = None
    """The model the engine is asked for, when an alias maps the asked one to it
    (model_names.py)."""
    token_allowance: int | None = None
    """The most tokens each choice may generate under the rollout's token budget
    (proxy/budget.py); the engine's request is lowered to it."""
    routed_experts: bool = False
    """The engine is asked for each token's routed experts (proxy/upstream/routed.py)."""


class Dispatch(NamedTuple):
    """Where and when the call was last sent."""

    at: datetime | None = None
    """When the last attempt went out (failover and a continuation send again)."""
    backend: str | None = None
    engine_request: bytes | None = None
    """The request as the backend that took it was sent it."""


class Outcome(NamedTuple):
    """How the call ended for its client; until then, the record's defaults."""

    status: CallStatus = CallStatus.OK
    http_status: int | None = None
    error: str | None = None
    finished_at: datetime | None = None
    response_body: bytes | None = None
    """What the client was answered (a stream as one body), or the engine's unreadable bytes."""


@dataclass(slots=True)
class Answer:
    """The engine's answer as it is read, chunk by chunk: written by the call's answer source
    as it reads (upstream/call.py, replay/recorded.py), the captured ids and logprobs by
    engines.capture_response."""

    captured: Captured = field(default_factory=Captured)
    usage: dict[str, Any] | None = None
    """The engine's usage: the last one it sent."""
    first_token_at: datetime | None = None
    upstream_done: float | None = None
    """perf_counter() when the engine's answer was complete (for the overhead metric)."""


# Shared: a part is immutable and replaced, never changed in place.
_NOTHING_ASKED, _NO_TERMS, _NOT_SENT, _UNFINISHED = Asked(), Terms(), Dispatch(), Outcome()


@dataclass(slots=True)
class Exchange:
    """One call being served: fixed at intake, then its parts (see the module's docstring)."""

    rollout_id: str
    dialect: CallDialect
    received_at: datetime
    raw_body: bytes | None
    """The body received; None when it was refused unread (over the size limit)."""
    body_hash: str | None = None
    """Of `raw_body`: how a retry finds the call it repeats (intake.link_retry)."""
    retry_count: int = 0
    call_id: str = field(default_factory=new_id)
    asked: Asked = _NOTHING_ASKED
    terms: Terms = _NO_TERMS
    weight_version: str | None = None
    """The policy version the weight hold let the call through under (a continuation's: the
    version it resumed under)."""
    dispatch: Dispatch = _NOT_SENT
    answer: Answer = field(default_factory=Answer)
    outcome: Outcome = _UNFINISHED
    retry_of: str | None = None
    resumes: str | None = None
    """The call whose answer, aborted for a weight update, this one continues."""
    bridge: str | None = None
    """Token-in mode: `bridged`, or why this call fell back (proxy/tokenin/lineage.py)."""
    lineage: LineageMark | None = None
    """Token-in mode: the answered call's lineage fingerprints, stored with it."""
    notes: list[str] = field(default_factory=list)

    @classmethod
    def received(
        cls,
        rollout_id: str,
        dialect: CallDialect,
        at: datetime,
        raw_body: bytes | None,
        retry_count: int,
        purpose: str | None,
    ) -> Exchange:
        """A call as intake found it: `raw_body` None when refused unread; `purpose` named by
        a header, if any."""
        digest = None if raw_body is None else body_hash(raw_body)
        asked = _NOTHING_ASKED if purpose is None else Asked(purpose=purpose)
        return cls(rollout_id, dialect, at, raw_body, digest, retry_count, asked=asked)

    # -- the request ----------------------------------------------------------------------------

    def understood(self, body: dict[str, Any], purpose: str | None = None) -> None:
        """The dialect read the body; `purpose`: the side call it recognised, unless a header
        named one already."""
        model = body.get("model")
        self.asked = Asked(
            body,
            body.get("stream") is True,
            model if isinstance(model, str) else None,
            self.asked.purpose or purpose,
        )

    def admitted(
        self, served_model: str | None, token_allowance: int | None, routed_experts: bool
    ) -> None:
        if served_model is not None or token_allowance is not None or routed_experts:
            self.terms = Terms(served_model, token_allowance, routed_experts)

    def retries(self, call_id: str) -> None:
        """The request repeats call `call_id` (intake.link_retry)."""
        self.retry_of = call_id

    # -- the engine call ------------------------------------------------------------------------

    def runs_under(self, weight_version: str | None) -> None:
        """The weight hold let the call through under this policy version."""
        self.weight_version = weight_version

    def tried(self, at: datetime) -> None:
        """An attempt that went out at `at` found no engine (failover tries the next)."""
        self.dispatch = Dispatch(at, self.dispatch.backend, self.dispatch.engine_request)

    def sent(self, at: datetime, backend: str, engine_request: bytes) -> None:
        """The backend took the request, sent at `at`."""
        self.dispatch = Dispatch(at, backend, engine_request)

    def aborted_part(self, response_body: bytes) -> Exchange:
        """The answer so far as a call of its own, its engine having aborted it for a weight
        update; this call goes on as its continuation (`continues`, upstream/resume.py)."""
        captured = self.answer.captured
        prompt, partial = len(captured.prompt_ids or ()), len(captured.choice(0).token_ids)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": partial,
            "total_tokens": prompt + partial,
        }
        return dataclasses.replace(
            self,
            call_id=new_id(),
            answer=dataclasses.replace(self.answer, usage=usage),
            outcome=Outcome(CallStatus.OK, 200, None, now(), response_body),
            notes=[*self.notes, f"aborted for a weight update; continued by {self.call_id}"],
        )

    def continues(self, first: Exchange) -> None:
        """The call goes on from `first`'s aborted answer: its prompt is that answer's prompt
        and ids; the ids it samples are its own."""
        captured = self.answer.captured
        prompt = [*(captured.prompt_ids or ()), *captured.choice(0).token_ids]
        self.resumes = first.call_id
        self.notes.append(f"continues {first.call_id}, aborted for a weight update")
        self.answer.captured = Captured(prompt_ids=prompt)

    # -- token-in -------------------------------------------------------------------------------

    def bridged(self, outcome: str) -> None:
        """`bridged`, or the reason code of a fallback (proxy/tokenin/lineage.py)."""
        self.bridge = outcome

    def remembered(self, lineage: LineageMark) -> None:
        """The answer became a turn of its lineage."""
        self.lineage = lineage

    # -- the outcome ----------------------------------------------------------------------------

    def answered(self, response_body: bytes | None) -> None:
        self.outcome = Outcome(CallStatus.OK, 200, None, now(), response_body)

    def reject(self, error: ProxyError) -> None:
        """Refused by the proxy, before any engine saw it."""
        self.outcome = Outcome(CallStatus.REJECTED, error.status, error.message, now())

    def fail(
        self,
        status: CallStatus,
        http_status: int | None,
        error: str,
        response_body: bytes | None = None,
    ) -> None:
        self.outcome = Outcome(status, http_status, error, now(), response_body)

    def drop_tokens(self, why: str) -> None:
        """Record the call without its token data (the store refused it), saying why."""
        self.answer.captured = Captured()
        self.notes.append(f"token data dropped: {why}")

    def to_record(self) -> CallRecord:
        """The row to store; InvalidTokens when the captured ids or logprobs are no numbers."""
        try:
            prompt, choices, capture = self._tokens()
        except (ValueError, TypeError) as e:
            raise InvalidTokens(f"engine token data unreadable: {type(e).__name__}: {e}") from e
        asked, dispatch, answer, outcome = self.asked, self.dispatch, self.answer, self.outcome
        captured = answer.captured
        routing = {}
        if capture is Capture.TOKENS and self.terms.routed_experts:
            routing = self._routing(prompt, choices)
        version, reported = self.weight_version, captured.weight_version
        if version and reported and reported != version:
            # The proxy's version is recorded; the engine saying otherwise must not go unseen.
            self.notes.append(
                f"the engine reported weight version {reported!r}, the proxy's is {version!r}"
            )
        error, notes = outcome.error, self.notes
        if notes:
            error = "; ".join([error, *notes] if error else notes)
        return CallRecord(
            rollout_id=self.rollout_id,
            dialect=self.dialect,
            status=outcome.status,
            capture=capture,
            received_at=self.received_at,
            stream=asked.stream,
            model=asked.model,
            purpose=asked.purpose,
            backend=dispatch.backend,
            http_status=outcome.http_status,
            error=error or None,
            dispatched_at=dispatch.at,
            first_token_at=answer.first_token_at,
            finished_at=outcome.finished_at or now(),
            weight_version=version or reported,
            usage=answer.usage,
            retry_count=self.retry_count,
            body_hash=self.body_hash,
            retry_of=self.retry_of,
            resumes=self.resumes,
            bridge=self.bridge,
            tool_parse=captured.tool_parse,
            weight_spans=_spans(captured),
            lineage=self.lineage,
            prompt_ids=prompt,
            choices=choices,
            routed_experts=routing,
            routed_source=_routed_source(captured),
            request_body=self.raw_body,
            engine_request=dispatch.engine_request,
            response_body=outcome.response_body,
            call_id=self.call_id,
        )

    def _tokens(self) -> tuple[Any, list[ChoiceRecord], Capture]:
        captured = self.answer.captured
        if not captured.choices and captured.prompt_ids is None:
            return None, [], Capture.NONE
        faithful = captured.prompt_ids is not None and all(
            c.has_ids for c in captured.choices.values()
        )
        if not faithful:
            self.notes.append("backend returned no token ids: text only")
            return None, [], Capture.TEXT
        choices = []
        for index in sorted(captured.choices):
            c = captured.choices[index]
            logprobs: Any = None
            if c.logprobs:
                if len(c.logprobs) == len(c.token_ids):
                    logprobs = logprob_list(c.logprobs)
                else:
                    self.notes.append(
                        f"choice {index}: {len(c.logprobs)} logprobs for {len(c.token_ids)} "
                        "ids; logprobs dropped"
                    )
            # No dtype: ids that are not integers keep their own type and the store refuses them.
            choices.append(ChoiceRecord(index, id_list(c.token_ids), logprobs, c.finish_reason))
        return id_list(captured.prompt_ids or []), choices, Capture.TOKENS

    def _routing(self, prompt: Any, choices: list[ChoiceRecord]) -> dict[int, Any]:
        """Each choice's routed experts, decoded and packed; what could not be is noted."""
        out: dict[int, Any] = {}
        for choice in choices:
            raw = self.answer.captured.routing.get(choice.index)
            if raw is None:
                continue
            tokens = len(prompt) + len(choice.token_ids)
            try:
                out[choice.index] = array = routed.decode(raw, tokens)
            except ValueError as e:
                self.notes.append(f"choice {choice.index}: routed experts unreadable ({e})")
                continue
            if len(array) != tokens - 1:
                self.notes.append(
                    f"choice {choice.index}: {len(array)} routed-expert rows for {tokens} "
                    f"tokens (the engine's count; {tokens - 1} expected)"
                )
        if not self.answer.captured.routing and self.outcome.status is CallStatus.OK:
            why = "start it with --enable-return-routed-experts (an MoE model)"
            if self.asked.stream:
                why = f"vLLM sends none on a stream (vllm#56745); else {why}"
            self.notes.append(f"the engine sent no routed experts: {why}")
        return out

    @property
    def completion_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.answer.captured.choices.values())

    @property
    def prompt_tokens(self) -> int:
        return len(self.answer.captured.prompt_ids or ())

    @property
    def tokens_used(self) -> int:
        """Prompt + completion as the store counts them: the ids, else the engine's usage."""
        usage = self.answer.usage or {}
        prompt = self.prompt_tokens or int(
            usage.get("prompt_tokens") or usage.get("input_tokens") or 0
        )
        completion = self.completion_tokens or int(
            usage.get("completion_tokens") or usage.get("output_tokens") or 0
        )
        return prompt + completion


def _routed_source(captured: Captured) -> str | None:
    """The engine encoding the routed experts were read from (the first choice's)."""
    if not captured.routing:
        return None
    return next(iter(captured.routing.values())).source.value


def _spans(captured: Captured) -> WeightSpans | None:
    """The choices sampled by more than one version, with their spans (store/records.py)."""
    spans = {
        str(index): c.weight_spans
        for index, c in sorted(captured.choices.items())
        if len({span[0] for span in c.weight_spans}) > 1
    }
    return spans or None
