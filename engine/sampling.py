"""Per-sequence sampling: logit processing, the draw, and the logprobs of what was drawn from."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .params import LogprobsMode, SamplingParams


@dataclass(frozen=True)
class Sample:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    """The `top_logprobs` most likely (token id, logprob) pairs, best first."""


class RowSampler:
    """Draws one sequence's tokens: its own RNG (seeded or not) and its own token counts."""

    def __init__(
        self,
        params: SamplingParams,
        mode: LogprobsMode,
        device: torch.device,
        vocab_size: int,
        prompt_ids: list[int],
        seed: int | None,
    ) -> None:
        self.params = params
        self.mode = mode
        self._generator = torch.Generator(device=device)
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)
        self._counts: torch.Tensor | None = None
        self._seen: torch.Tensor | None = None
        if params.penalised:
            self._counts = torch.zeros(vocab_size, device=device)
            self._seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            ids = [i for i in prompt_ids if 0 <= i < vocab_size]
            if ids:
                self._seen[torch.tensor(ids, device=device)] = True

    def sample(self, logits: torch.Tensor) -> Sample:
        """Draw from one row of float32 logits and report logprobs per the mode."""
        p = self.params
        x = self._penalise(logits) if p.penalised else logits
        if p.greedy:
            dist = torch.log_softmax(x, dim=-1)
            token = int(torch.argmax(x))
        else:
            dist = torch.log_softmax(_filter(x / p.temperature, p), dim=-1)
            token = int(torch.multinomial(dist.exp(), 1, generator=self._generator))
        if self.mode is LogprobsMode.RAW and (p.penalised or not p.greedy):
            dist = torch.log_softmax(logits, dim=-1)
        top: tuple[tuple[int, float], ...] = ()
        if p.top_logprobs:
            values, ids = torch.topk(dist, min(p.top_logprobs, dist.shape[-1]))
            top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
        self._observe(token)
        return Sample(token, min(float(dist[token]), 0.0), top)

    def _penalise(self, logits: torch.Tensor) -> torch.Tensor:
        p = self.params
        assert self._counts is not None
        assert self._seen is not None
        x = logits.clone()
        if p.repetition_penalty != 1.0:
            seen = self._seen | (self._counts > 0)
            x = torch.where(
                seen & (x > 0),
                x / p.repetition_penalty,
                torch.where(seen, x * p.repetition_penalty, x),
            )
        x = x - p.frequency_penalty * self._counts - p.presence_penalty * (self._counts > 0)
        for token_id, bias in p.logit_bias:
            if 0 <= token_id < x.shape[-1]:
                x[token_id] += bias
        return x

    def _observe(self, token: int) -> None:
        if self._counts is not None:
            self._counts[token] += 1


def _filter(x: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Mask to -inf what top-k, top-p and min-p exclude; the most likely token always survives."""
    if 0 < p.top_k < x.shape[-1]:
        kth = torch.topk(x, p.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if p.top_p < 1.0:
        ordered, order = torch.sort(x, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        drop = (torch.cumsum(probs, dim=-1) - probs) > p.top_p
        drop[0] = False
        x = x.scatter(0, order, ordered.masked_fill(drop, float("-inf")))
    if p.min_p > 0.0:
        probs = torch.softmax(x, dim=-1)
        x = x.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    return x
