"""What a generation asks the batcher for, and the events it hands back as tokens are sampled."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .params import SamplingParams


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    cache_salt: str | None = None
    """vLLM's `cache_salt`: only requests with the same salt share prefix-cache entries."""


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token of choice `index`, with the text it released and maybe the finish."""

    index: int
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    text: str
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    weight_version: str | None = None
    """The label of the weights that sampled this token."""


@dataclass(frozen=True)
class Aborted:
    """Choice `index` was stopped before it finished (a weight update with `abort_all_requests`):
    what was sampled stands, and the choice ends with finish_reason "abort"."""

    index: int
    text: str
    """Text the choice's detokenizer still held back, released now."""
    weight_version: str | None = None


RowEvent = TokenEvent | Aborted
"""What a route gets per choice: a sampled token, or the end of an aborted choice."""


@dataclass(frozen=True)
class Failure:
    """The engine could not finish the request (a forward pass failed, or shutdown)."""

    message: str


Event = TokenEvent | Aborted | Failure
Sink = Callable[[Event], None]
