"""One request's life in the proxy, and the call record it becomes."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ...store import CallDialect, CallRecord, CallStatus, Capture, ChoiceRecord, InvalidTokens
from ...store.ids import body_hash, new_id
from ...store.packing import id_list, logprob_list
from ...store.records import LineageMark
from ..dialects.errors import ProxyError
from . import routed
from .engines import Captured

RETRY_HEADER = "x-stainless-retry-count"
# Headers by which harnesses name side calls (title generation, compaction, sub-agents).
PURPOSE_HEADERS = ("x-rolltap-purpose", "x-openai-subagent")


def now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Exchange:
    rollout_id: str
    dialect: CallDialect
    received_at: datetime
    raw_body: bytes | None
    retry_count: int = 0
    purpose: str | None = None
    call_id: str = field(default_factory=new_id)
    body: dict[str, Any] | None = None
    stream: bool = False
    model: str | None = None
    backend: str | None = None
    engine_request: bytes | None = None
    dispatched_at: datetime | None = None
    first_token_at: datetime | None = None
    finished_at: datetime | None = None
    weight_version: str | None = None
    captured: Captured = field(default_factory=Captured)
    response_body: bytes | None = None
    status: CallStatus = CallStatus.OK
    http_status: int | None = None
    error: str | None = None
    usage: dict[str, Any] | None = None
    retry_of: str | None = None
    resumes: str | None = None
    """The call whose answer, aborted for a weight update, this one continues."""
    bridge: str | None = None
    """Token-in mode: `bridged`, or why this call fell back (proxy/tokenin/lineage.py)."""
    lineage: LineageMark | None = None
    """Token-in mode: the answered call's lineage fingerprints, stored with it."""
    notes: list[str] = field(default_factory=list)
    upstream_done: float | None = None
    """perf_counter() when the engine's answer was complete (for the overhead metric)."""
    served_model: str | None = None
    """The model the engine is asked for, when an alias maps `model` to it (model_names.py)."""
    token_allowance: int | None = None
    """The most tokens each choice may generate under the rollout's token budget (set at
    admission, proxy/budget.py); the engine's request is lowered to it."""
    routed_experts: bool = False
    """The engine is asked for each token's routed experts (proxy/upstream/routed.py)."""

    @functools.cached_property
    def body_hash(self) -> str | None:
        """Read only once the body is in (intake sets raw_body before anything asks)."""
        return None if self.raw_body is None else body_hash(self.raw_body)

    def reject(self, error: ProxyError) -> None:
        self.status = CallStatus.REJECTED
        self.http_status = error.status
        self.error = error.message
        self.finished_at = now()

    def fail(self, status: CallStatus, http_status: int | None, error: str) -> None:
        self.status = status
        self.http_status = http_status
        self.error = error
        self.finished_at = now()

    def drop_tokens(self, why: str) -> None:
        """Record the call without its token data (the store refused it), saying why."""
        self.captured = Captured()
        self.notes.append(f"token data dropped: {why}")

    def to_record(self) -> CallRecord:
        """The row to store; InvalidTokens when the captured ids or logprobs are no numbers."""
        try:
            prompt, choices, capture = self._tokens()
        except (ValueError, TypeError) as e:
            raise InvalidTokens(f"engine token data unreadable: {type(e).__name__}: {e}") from e
        routing = self._routing(prompt, choices) if capture is Capture.TOKENS else {}
        reported = self.captured.weight_version
        if self.weight_version and reported and reported != self.weight_version:
            # The proxy's version is recorded; the engine saying otherwise must not go unseen.
            self.notes.append(
                f"the engine reported weight version {reported!r}, the proxy's is "
                f"{self.weight_version!r}"
            )
        error = "; ".join([*([self.error] if self.error else []), *self.notes]) or None
        return CallRecord(
            rollout_id=self.rollout_id,
            dialect=self.dialect,
            status=self.status,
            capture=capture,
            received_at=self.received_at,
            stream=self.stream,
            model=self.model,
            purpose=self.purpose,
            backend=self.backend,
            http_status=self.http_status,
            error=error,
            dispatched_at=self.dispatched_at,
            first_token_at=self.first_token_at,
            finished_at=self.finished_at or now(),
            weight_version=self.weight_version or self.captured.weight_version,
            usage=self.usage,
            retry_count=self.retry_count,
            body_hash=self.body_hash,
            retry_of=self.retry_of,
            resumes=self.resumes,
            bridge=self.bridge,
            tool_parse=self.captured.tool_parse,
            lineage=self.lineage,
            prompt_ids=prompt,
            choices=choices,
            routed_experts=routing,
            routed_source=next((r.source.value for r in self.captured.routing.values()), None),
            request_body=self.raw_body,
            engine_request=self.engine_request,
            response_body=self.response_body,
            call_id=self.call_id,
        )

    def _tokens(self) -> tuple[Any, list[ChoiceRecord], Capture]:
        captured = self.captured
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
        if not self.routed_experts:
            return {}
        out: dict[int, Any] = {}
        for choice in choices:
            raw = self.captured.routing.get(choice.index)
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
        if not self.captured.routing and self.status is CallStatus.OK:
            why = "start it with --enable-return-routed-experts (an MoE model)"
            if self.stream:
                why = f"vLLM sends none on a stream (vllm#56745); else {why}"
            self.notes.append(f"the engine sent no routed experts: {why}")
        return out

    @property
    def completion_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.captured.choices.values())

    @property
    def prompt_tokens(self) -> int:
        return len(self.captured.prompt_ids or ())

    @property
    def tokens_used(self) -> int:
        """Prompt + completion as the store counts them: the ids, else the engine's usage."""
        usage = self.usage or {}
        prompt = self.prompt_tokens or int(
            usage.get("prompt_tokens") or usage.get("input_tokens") or 0
        )
        completion = self.completion_tokens or int(
            usage.get("completion_tokens") or usage.get("output_tokens") or 0
        )
        return prompt + completion
