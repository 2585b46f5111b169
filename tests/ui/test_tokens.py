"""Token text for strips: which tokenizer a rollout gets, and the probability bands."""

from __future__ import annotations

import math

import pytest

from rolltap.engine.errors import ModelLoadError
from rolltap.engine.model import DEFAULT_SERVED_NAME, default_gguf_path
from rolltap.ui.tokens import Tokenizers, band


@pytest.mark.model
async def test_the_builtin_tokenizer_serves_only_its_own_model() -> None:
    try:
        gguf = default_gguf_path()
    except ModelLoadError as e:
        pytest.skip(str(e))
    source = Tokenizers(None, (DEFAULT_SERVED_NAME, gguf))
    assert await source.for_model("Qwen/Qwen3-8B") is None  # another vocabulary: ids, not text
    texts = await source.for_model(DEFAULT_SERVED_NAME)
    assert texts is not None
    assert await texts.texts([1, 2]) == ["<|im_start|>", "<|im_end|>"]
    assert await source.for_model(DEFAULT_SERVED_NAME) is texts  # loaded once
    assert await Tokenizers(None, None).for_model(DEFAULT_SERVED_NAME) is None


@pytest.mark.parametrize(
    ("p", "expected"),
    [(1.0, 0), (0.9, 0), (0.89, 1), (0.5, 2), (0.2, 3), (0.05, 4), (0.001, 5), (0.0, 5)],
)
def test_bands(p: float, expected: int) -> None:
    assert band(math.log(p) if p else -math.inf) == expected


def test_no_logprob_has_its_own_band() -> None:
    assert band(math.nan) == 6
