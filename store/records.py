"""Typed data crossing the store's boundary: what callers write and what readers get back."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .enums import CallDialect, CallStatus, Capture, RolloutStatus, Verdict

if TYPE_CHECKING:
    # Types only: a listing of rows (`rolltap ls`) reads no token arrays and loads no numpy.
    from .packing import IdArray, LogprobArray, RoutingArray

# --- written -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NewRollout:
    batch_id: str | None = None
    task_id: str | None = None
    sample_index: int | None = None
    attempt: int = 0
    harness: str | None = None
    model: str | None = None
    max_calls: int | None = None
    max_tokens: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    key: str | None = None
    """Use this secret key instead of a fresh one (the proxy's --open mode)."""


@dataclass(frozen=True)
class CreatedRollout:
    id: str
    key: str
    """The secret key: shown once, stored only as a hash."""


WeightSpans = dict[str, list[list[Any]]]
"""Which weights sampled which tokens of an answer that spans a weight update (in_place): choice
index (as text) -> [[version, start, end], ...] over its sampled tokens, [start, end) contiguous
and in order, as the engine reported them (vLLM's `weight_versions`). Stored only when an answer
has more than one version; otherwise the call's `weight_version` covers every token."""


@dataclass(frozen=True)
class ChoiceRecord:
    index: int
    token_ids: IdArray
    logprobs: LogprobArray | None = None
    finish_reason: str | None = None


@dataclass(frozen=True)
class LineageMark:
    """A token-in call's lineage fingerprints (proxy/tokenin/lineage.py), stored beside it."""

    request: bytes
    answer: bytes
    context: bytes


@dataclass(frozen=True)
class StoredTurn:
    """A token-in call as a lineage turn, read back: its fingerprints and its ids."""

    call_id: str
    answer: bytes
    context: bytes
    prompt_ids: IdArray
    sampled_ids: IdArray
    finish_reason: str | None


@dataclass
class CallRecord:
    """One request the proxy received, as it will be stored."""

    rollout_id: str
    dialect: CallDialect
    status: CallStatus
    capture: Capture
    received_at: datetime
    stream: bool = False
    model: str | None = None
    purpose: str | None = None
    backend: str | None = None
    http_status: int | None = None
    error: str | None = None
    dispatched_at: datetime | None = None
    first_token_at: datetime | None = None
    finished_at: datetime | None = None
    weight_version: str | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    retry_count: int = 0
    body_hash: str | None = None
    retry_of: str | None = None
    resumes: str | None = None
    """The call whose aborted answer this one continues (a weight update in abort_resume)."""
    bridge: str | None = None
    """Token-in mode: `bridged`, or the reason code of a fallback; None in normal mode."""
    tool_parse: str | None = None
    """Whether the answer's tool calls parsed, where rolltap or its engine parsed them: `ok`,
    `malformed: <reason>` or `none` (analysis/toolparse.py); None where nothing said."""
    weight_spans: WeightSpans | None = None
    """An answer sampled across a weight update: which version sampled which tokens."""
    weights_digest: str | None = None
    """The digest of the checksums of the weights its version was served with, where the
    engines offer checksums (store/models.py WeightChecksum); sealed into its digest."""
    lineage: LineageMark | None = None
    """Token-in mode: what lets another proxy process continue this call's conversation."""
    prompt_ids: IdArray | None = None
    choices: list[ChoiceRecord] = field(default_factory=list)
    routed_experts: dict[int, RoutingArray] = field(default_factory=dict)
    """Choice index -> the experts each token of its prompt and answer was routed to, as the
    engine sent them, packed (rows: tokens - 1; store/routed.py)."""
    routed_source: str | None = None
    """The engine encoding they were read from: vllm or sglang (proxy/upstream/routed.py)."""
    request_body: bytes | None = None
    engine_request: bytes | None = None
    response_body: bytes | None = None
    call_id: str | None = None
    """An id chosen by the caller (the proxy sends it to the engine as X-Request-Id)."""


@dataclass(frozen=True)
class CallReceipt:
    call_id: str
    seq: int


# --- read ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RolloutView:
    id: str
    batch_id: str | None
    task_id: str | None
    sample_index: int | None
    harness: str | None
    model: str | None
    status: RolloutStatus
    reward: float | None
    reward_details: dict[str, Any] | None
    error: str | None
    max_calls: int | None
    max_tokens: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    meta: dict[str, Any]
    n_calls: int = 0
    n_tokens: int = 0
    """Prompt plus completion tokens over all calls."""
    n_rejected: int = 0
    """Calls the proxy refused (bad request, finished rollout, budget): budgets don't count them."""
    attempt: int = 0
    head_hash: str | None = None
    """The hash of its last call when the rollout ended (store/chain.py); None while it runs."""
    head_seq: int | None = None
    key_revoked_at: datetime | None = None
    """Set when the harness ended: the proxy refuses the key's calls from then on."""
    hack_flags: list[dict[str, Any]] | None = None
    """What the reward-hack detectors flagged (analysis/hacks.py): None when never checked."""

    @property
    def verdict(self) -> Verdict:
        """Whether the task passed (its reward); `status` says only how the run ended."""
        return Verdict.of(self.reward)

    def as_dict(self) -> dict[str, Any]:
        """JSON values under stable names (`rolltap ls --json`); times are ISO 8601 UTC."""
        return {
            "id": self.id,
            "batch_id": self.batch_id,
            "task_id": self.task_id,
            "sample_index": self.sample_index,
            "attempt": self.attempt,
            "harness": self.harness,
            "model": self.model,
            "status": self.status.value,
            "reward": self.reward,
            "verdict": self.verdict.value,
            "reward_details": self.reward_details,
            "error": self.error,
            "max_calls": self.max_calls,
            "max_tokens": self.max_tokens,
            "n_calls": self.n_calls,
            "n_tokens": self.n_tokens,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "head_hash": self.head_hash,
            "head_seq": self.head_seq,
            "key_revoked_at": _iso(self.key_revoked_at),
            "hack_flags": self.hack_flags,
            "meta": self.meta,
        }


@dataclass(frozen=True)
class CallView:
    id: str
    rollout_id: str
    seq: int
    dialect: CallDialect
    purpose: str | None
    model: str | None
    backend: str | None
    status: CallStatus
    http_status: int | None
    error: str | None
    stream: bool
    capture: Capture
    received_at: datetime
    dispatched_at: datetime | None
    first_token_at: datetime | None
    finished_at: datetime | None
    weight_version: str | None
    finish_reason: str | None
    usage: dict[str, Any] | None
    retry_count: int
    body_hash: str | None
    retry_of: str | None
    prompt_tokens: int
    completion_tokens: int
    n_choices: int
    resumes: str | None = None
    """The call whose aborted answer this one continues (see CallRecord.resumes)."""
    bridge: str | None = None
    """Token-in mode: `bridged` or the fallback's reason code (see CallRecord.bridge)."""
    tool_parse: str | None = None
    """`ok`, `malformed: <reason>` or `none` (see CallRecord.tool_parse)."""
    weight_spans: WeightSpans | None = None
    """Which version sampled which tokens, for an answer that spans an update (CallRecord)."""
    weights_digest: str | None = None
    """The digest of its version's weight checksums (CallRecord.weights_digest)."""
    digest: str | None = None
    """SHA-256 of the record's canonical encoding (store/chain.py)."""
    hash: str | None = None
    """Its link in the rollout's hash chain (store/chain.py)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON values under stable names (`rolltap show --json`); times are ISO 8601 UTC."""
        return {
            "id": self.id,
            "rollout_id": self.rollout_id,
            "seq": self.seq,
            "dialect": self.dialect.value,
            "purpose": self.purpose,
            "model": self.model,
            "backend": self.backend,
            "status": self.status.value,
            "http_status": self.http_status,
            "error": self.error,
            "stream": self.stream,
            "capture": self.capture.value,
            "received_at": _iso(self.received_at),
            "dispatched_at": _iso(self.dispatched_at),
            "first_token_at": _iso(self.first_token_at),
            "finished_at": _iso(self.finished_at),
            "weight_version": self.weight_version,
            "finish_reason": self.finish_reason,
            "usage": self.usage,
            "retry_count": self.retry_count,
            "retry_of": self.retry_of,
            "body_hash": self.body_hash,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "n_choices": self.n_choices,
            "bridge": self.bridge,
            "tool_parse": self.tool_parse,
            "weight_spans": self.weight_spans,
            "weights_digest": self.weights_digest,
            "digest": self.digest,
            "hash": self.hash,
        }


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


@dataclass(frozen=True)
class ChoiceTokens:
    index: int
    token_ids: IdArray
    logprobs: LogprobArray | None
    finish_reason: str | None


@dataclass(frozen=True)
class CallTokens:
    call_id: str
    prompt_ids: IdArray
    choices: list[ChoiceTokens]


@dataclass(frozen=True)
class CallBodies:
    request: bytes | None
    engine_request: bytes | None
    response: bytes | None


@dataclass(frozen=True)
class RolloutAnalysis:
    """A rollout's stored faithfulness summary (written when it finished; see trajectory)."""

    rollout_id: str
    analyzed_at: datetime
    calls: int
    """Calls the rollout had when analysed: fewer than it has now means the summary is stale."""
    segments: int
    sampled_tokens: int
    lost_tokens: int
    share: float
    breaks: dict[str, int]
    """Breaks by drift class."""
    side_calls: int


@dataclass(frozen=True)
class BatchView:
    batch_id: str
    rollouts: int
    """Every attempt, superseded ones (cancelled) included."""
    tasks: int
    statuses: dict[str, int]
    rewarded: int
    """Rollouts with a reward."""
    mean_reward: float | None
    passed: int
    """Rollouts whose reward reached the pass mark."""
    created_at: datetime
    finished_at: datetime | None
