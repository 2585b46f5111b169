"""Sampling parameters and the logprobs mode: plain data, importable without torch."""

from __future__ import annotations

import enum
from dataclasses import dataclass

# vLLM treats temperatures below this as greedy.
GREEDY_EPS = 1e-5


class LogprobsMode(enum.StrEnum):
    PROCESSED = "processed_logprobs"
    """log-softmax of the distribution sampled from (after penalties, temperature, top-k/p)."""
    RAW = "raw_logprobs"
    """log-softmax of the model's logits before any processing."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 (or -1 on the wire) disables top-k."""
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    top_logprobs: int = 0
    """How many alternatives to report per position besides the sampled token."""

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def penalised(self) -> bool:
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
        )
