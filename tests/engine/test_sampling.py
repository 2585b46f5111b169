"""Per-row sampling: filters, seeds, and which distribution the logprobs describe."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from rolltap.engine.params import LogprobsMode, SamplingParams
from rolltap.engine.sampling import RowSampler

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def sampler(
    mode: LogprobsMode = LogprobsMode.PROCESSED, seed: int | None = 0, **params: Any
) -> RowSampler:
    return RowSampler(SamplingParams(**params), mode, torch.device("cpu"), 6, [], seed)


def test_greedy_takes_the_argmax_with_raw_logprobs() -> None:
    sample = sampler(temperature=0.0, top_logprobs=2).sample(LOGITS)
    expected = torch.log_softmax(LOGITS, -1)
    assert sample.token_id == 0
    assert sample.logprob == pytest.approx(float(expected[0]))
    assert [t for t, _ in sample.top] == [0, 1]


@pytest.mark.parametrize(
    ("params", "allowed"),
    [
        ({"top_k": 2}, {0, 1}),
        ({"top_p": 0.5}, {0}),
        ({"top_p": 0.7}, {0, 1}),
        ({"min_p": 0.3}, {0, 1}),
        ({"top_k": 3, "top_p": 0.99}, {0, 1, 2}),
    ],
)
def test_filters_limit_what_is_drawn(params: dict[str, Any], allowed: set[int]) -> None:
    row = sampler(LogprobsMode.PROCESSED, 3, temperature=1.0, **params)
    drawn = {row.sample(LOGITS).token_id for _ in range(200)}
    assert drawn <= allowed
    assert len(drawn) == len(allowed)


def test_processed_logprobs_are_of_the_filtered_tempered_distribution() -> None:
    row = sampler(temperature=0.5, top_k=2, top_logprobs=3)
    sample = row.sample(LOGITS)
    kept = torch.log_softmax(LOGITS[:2] / 0.5, -1)
    assert sample.logprob == pytest.approx(float(kept[sample.token_id]))
    assert [t for t, _ in sample.top[:2]] == [0, 1]
    assert sample.top[2][1] == -math.inf  # filtered out


def test_raw_logprobs_ignore_processing() -> None:
    sample = sampler(LogprobsMode.RAW, temperature=0.5, top_k=2).sample(LOGITS)
    raw = torch.log_softmax(LOGITS, -1)
    assert sample.logprob == pytest.approx(float(raw[sample.token_id]))


def test_seeds_reproduce_and_unseeded_rows_differ() -> None:
    def draws(row: RowSampler) -> list[int]:
        return [row.sample(LOGITS).token_id for _ in range(40)]

    assert draws(sampler(seed=9, temperature=1.0)) == draws(sampler(seed=9, temperature=1.0))
    assert draws(sampler(seed=9, temperature=1.0)) != draws(sampler(seed=10, temperature=1.0))
    assert draws(sampler(seed=None, temperature=1.0)) != draws(sampler(seed=None, temperature=1.0))


def test_penalties_and_bias_steer_greedy_choice() -> None:
    row = RowSampler(
        SamplingParams(temperature=0.0, frequency_penalty=2.0),
        LogprobsMode.PROCESSED,
        torch.device("cpu"),
        6,
        [],
        None,
    )
    assert [row.sample(LOGITS).token_id for _ in range(2)] == [0, 1]  # 2.0 - 2 < 1.0
    biased = RowSampler(
        SamplingParams(temperature=0.0, logit_bias=((5, 10.0),)),
        LogprobsMode.PROCESSED,
        torch.device("cpu"),
        6,
        [],
        None,
    )
    assert biased.sample(LOGITS).token_id == 5
