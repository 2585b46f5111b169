"""Typed data crossing the store's boundary: what callers write and what readers get back."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rolltap.store.models import CallDialect, CallStatus, Capture, RolloutStatus
from rolltap.store.packing import IdArray, LogprobArray

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


@dataclass(frozen=True)
class ChoiceRecord:
    index: int
    token_ids: IdArray
    logprobs: LogprobArray | None = None
    finish_reason: str | None = None


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
    prompt_ids: IdArray | None = None
    choices: list[ChoiceRecord] = field(default_factory=list)
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
    attempt: int = 0


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
