"""Fixtures of the engine suite: the shared engine process, its tokenizer, a reference model."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from rolltap.engine.model import default_gguf_path, offline_hub
from tests.support.engine import smollm_engine  # noqa: F401 - a fixture


def _load_reference() -> Any:
    offline_hub()
    import torch
    from transformers import AutoModelForCausalLM

    path = default_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, local_files_only=True
    )
    return model.eval()


@pytest.fixture(scope="session", autouse=True)
def _reference_loading(request: pytest.FixtureRequest) -> Iterator[Future[Any] | None]:
    """Start loading the reference model at once when a test will need it: it takes ~15 s,
    during which the engine process loads too."""
    needed = any(
        "reference_model" in getattr(item, "fixturenames", ()) for item in request.session.items
    )
    if not needed:
        yield None
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit(_load_reference)


@pytest.fixture(scope="session")
def reference_model(_reference_loading: Future[Any] | None) -> Any:
    """SmolLM2 in float32 loaded from the GGUF file in the test process with transformers,
    independent of the engine's loading (and of its dequantized-copy cache)."""
    assert _reference_loading is not None
    return _reference_loading.result()


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """SmolLM2's tokenizer, loaded with transformers directly (not through the engine)."""
    offline_hub()
    from transformers import AutoTokenizer

    path = default_gguf_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
