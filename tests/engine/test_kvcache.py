"""The left-padded batch cache gives each row the logits it would get decoded alone."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rolltap.engine.kvcache import BatchCache, columns, join, keep, new_cache

pytestmark = pytest.mark.model

PROMPTS = [[1, 4093, 198, 1780, 314], [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173], [1, 520]]
STEPS = [[28, 29, 30], [31, 32, 33], [34, 35, 36]]  # fed tokens per row, one per decode step


def prefill(model: Any, ids: list[int]) -> Any:
    shape = (1, model.config.num_key_value_heads, len(ids) + 1, model.config.head_dim)
    cache = new_cache(model.config.num_hidden_layers, shape, torch.float32, torch.device("cpu"))
    model(
        input_ids=torch.tensor([ids]),
        position_ids=torch.arange(len(ids)).view(1, -1),
        past_key_values=cache,
        use_cache=True,
    )
    return cache


def alone(model: Any, prompt: list[int], fed: list[int]) -> torch.Tensor:
    """Next-token logits after each fed token, computed by one plain forward pass."""
    logits: torch.Tensor = model(input_ids=torch.tensor([prompt + fed])).logits[0].float()
    return logits[len(prompt) :]


def decode(model: Any, batch: BatchCache, tokens: list[int]) -> torch.Tensor:
    logits: torch.Tensor = model(**batch.step_inputs(torch.tensor(tokens))).logits[:, -1]
    return logits.float()


@torch.inference_mode()
def test_rows_of_different_lengths_join_decode_and_leave(reference_model: Any) -> None:
    model = reference_model
    expected = [alone(model, p, s) for p, s in zip(PROMPTS, STEPS, strict=True)]
    batch: BatchCache | None = None
    for prompt in PROMPTS:
        batch = join(batch, prefill(model, prompt), 1)
    assert batch is not None
    assert batch.columns == max(len(p) for p in PROMPTS)
    assert batch.mask.sum(dim=1).tolist() == [len(p) for p in PROMPTS]

    step0 = decode(model, batch, [s[0] for s in STEPS])
    for row in range(3):
        assert torch.allclose(step0[row], expected[row][0], atol=1e-4)

    # the longest row leaves: its padding-only columns go with it
    kept = keep(batch, [0, 2])
    assert kept is not None
    assert kept.columns == len(PROMPTS[0]) + 1
    step1 = decode(model, kept, [STEPS[0][1], STEPS[2][1]])
    assert torch.allclose(step1[0], expected[0][1], atol=1e-4)
    assert torch.allclose(step1[1], expected[2][1], atol=1e-4)

    # a newcomer longer than every row pads the others on the left
    long_prompt = PROMPTS[1] + [400, 401, 402]
    grown = join(kept, prefill(model, long_prompt), 2)
    step2 = decode(model, grown, [STEPS[0][2], STEPS[2][2], 50, 51])
    assert torch.allclose(step2[0], expected[0][2], atol=1e-4)
    assert torch.allclose(step2[1], expected[2][2], atol=1e-4)
    assert torch.allclose(step2[2], alone(model, long_prompt, [50])[0], atol=1e-4)
    assert torch.allclose(step2[3], alone(model, long_prompt, [51])[0], atol=1e-4)
    assert keep(grown, []) is None


@torch.inference_mode()
def test_the_cache_grows_past_its_headroom(reference_model: Any) -> None:
    model = reference_model
    batch = join(None, prefill(model, PROMPTS[2]), 1)
    fed = list(range(100, 180))  # more steps than the 64 spare columns
    for token in fed[:-1]:
        decode(model, batch, [token])
    last = decode(model, batch, [fed[-1]])
    assert torch.allclose(last[0], alone(model, PROMPTS[2], fed)[-1], atol=1e-4)


@torch.inference_mode()
def test_columns_copied_from_a_batch_row_seed_a_new_prefill(reference_model: Any) -> None:
    """What prefix caching does: a padded batch row's keys/values start another prompt."""
    model = reference_model
    batch = join(join(None, prefill(model, PROMPTS[1]), 1), prefill(model, PROMPTS[0]), 1)
    for fed in ([40, 28], [41, 29]):  # row 1 (the shorter, left-padded one) is fed 28 then 29
        decode(model, batch, fed)
    held = PROMPTS[0] + [28, 29]
    first = batch.first_column(1)
    assert batch.columns - first == len(held)
    kv = columns(batch.cache, 1, first, batch.columns)
    assert kv.shape == (model.config.num_hidden_layers, 2, 3, len(held), 64)

    prompt = [*held, 30, 31, 32]
    shape = (1, model.config.num_key_value_heads, len(prompt) + 1, model.config.head_dim)
    segments = [kv[:, :, :, :3], kv[:, :, :, 3:]]  # a hit spanning two radix-tree nodes
    layers = model.config.num_hidden_layers
    cache = new_cache(layers, shape, torch.float32, torch.device("cpu"), segments)
    assert cache.get_seq_length() == len(held)
    out = model(
        input_ids=torch.tensor([prompt[len(held) :]]),
        position_ids=torch.arange(len(held), len(prompt)).view(1, -1),
        past_key_values=cache,
        use_cache=True,
    )
    expected = model(input_ids=torch.tensor([prompt])).logits[0, len(held) :].float()
    assert torch.allclose(out.logits[0].float(), expected, atol=1e-4)
