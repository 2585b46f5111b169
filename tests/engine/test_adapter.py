"""The LoRA adapter on the built-in engine (engine/adapter.py): merged at load it changes what the
model computes, `--adapter none` is the plain model, and a wrong adapter is one error line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rolltap.engine.adapter import DEFAULT_ADAPTER
from rolltap.engine.launch import EngineProcess
from tests.support.cli import rolltap
from tests.support.engine import post_json

pytestmark = [pytest.mark.model, pytest.mark.slow]

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def adapted() -> Iterator[EngineProcess]:
    with EngineProcess.start(extra_args=("--adapter=default",)) as engine:
        yield engine


async def greedy(engine: EngineProcess, prompt: str | list[int]) -> dict[str, Any]:
    """Four greedy tokens after `prompt`, with each one's logprob."""
    body = {"model": engine.model, "prompt": prompt, "max_tokens": 4, "temperature": 0}
    status, answer = await post_json(
        engine.url, "/v1/completions", {**body, "logprobs": 0, "return_token_ids": True}
    )
    assert status == 200, answer
    choice: dict[str, Any] = answer["choices"][0]
    return choice


async def test_the_adapter_changes_the_weights(
    smollm_engine: EngineProcess, adapted: EngineProcess
) -> None:
    plain = await greedy(smollm_engine, PROMPT)
    merged = await greedy(adapted, PROMPT)
    # The first token is sampled from the same prompt by both: another token, or the same one
    # with another logprob, means other weights.
    same_token = merged["token_ids"][0] == plain["token_ids"][0]
    gap = abs(merged["logprobs"]["token_logprobs"][0] - plain["logprobs"]["token_logprobs"][0])
    assert not same_token or gap > 1e-3, (merged, plain)
    assert DEFAULT_ADAPTER.stat().st_size < 8 * 2**20


async def test_adapter_none_is_the_plain_model(smollm_engine: EngineProcess) -> None:
    with EngineProcess.start(extra_args=("--adapter=none",)) as engine:
        none = await greedy(engine, PROMPT)
    plain = await greedy(smollm_engine, PROMPT)
    assert none["token_ids"] == plain["token_ids"]
    assert none["logprobs"]["token_logprobs"] == pytest.approx(
        plain["logprobs"]["token_logprobs"], abs=1e-4
    )


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "is not a file"),
        (b"not a safetensors file", "is not a safetensors file"),
        (b"\x02\x00\x00\x00\x00\x00\x00\x00{}", "has no `alpha` and `rank`"),
    ],
)
@pytest.mark.parametrize("command", [("model", "serve", "--port", "0"), ("demo",)])
def test_a_wrong_adapter_is_one_line(
    tmp_path: Path, command: tuple[str, ...], content: bytes | None, says: str
) -> None:
    adapter = tmp_path / "adapter.safetensors"
    if content is not None:
        adapter.write_bytes(content)
    done = rolltap(tmp_path, *command, "--adapter", str(adapter))
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
