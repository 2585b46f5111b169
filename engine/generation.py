"""What a generation asks the batcher for, and the events it hands back as tokens are sampled."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rolltap.engine.params import SamplingParams


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


@dataclass(frozen=True)
class Failure:
    """The engine could not finish the request (a forward pass failed, or shutdown)."""

    message: str


Event = TokenEvent | Failure
Sink = Callable[[Event], None]
