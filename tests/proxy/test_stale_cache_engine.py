"""No call is served from a prefix cache of older weights, on the real built-in engine: a trainer
changes the weights on the engine itself (no flush), then commits the version through the proxy
without `model_path`. The next call's logprobs for a prompt the engine cached under the old
weights equal a freshly started engine's with the new weights; the same prompt sent to the
engine unsalted, as before this guarantee, reads the stale cache and differs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rolltap.engine.launch import EngineProcess
from rolltap.store import Store
from tests.support.engine import engine_stats, post_json
from tests.support.proxy import new_rollout, running_proxy
from tests.support.weights import save_weights, served_weights

pytestmark = [pytest.mark.model]

TOLERANCE = 1e-3
"""examples/grpo_cpu.py's engine-vs-trainer logprob tolerance."""

PROMPT = [
    {"role": "system", "content": "You are a careful assistant who answers in one word."},
    {"role": "user", "content": "Name the largest planet of the solar system, please."},
]
ASK = {"messages": PROMPT, "max_tokens": 4, "temperature": 0.0, "logprobs": True}


@pytest.fixture
def engine() -> Iterator[EngineProcess]:
    """An engine of this test's own: its weights are changed."""
    with EngineProcess.start() as started:
        yield started


def _changed(directory: Path) -> Path:
    """Every layer's value projection scaled: the K/V of a cached prefix change with it."""
    tensors = dict(served_weights())
    for name in [n for n in tensors if n.endswith("self_attn.v_proj.weight")]:
        tensors[name] = tensors[name] * 1.3
    return save_weights(tensors, directory)


def _logprobs(answer: dict[str, Any]) -> list[float]:
    content = answer["choices"][0]["logprobs"]["content"]
    return [entry["logprob"] for entry in content]


async def _chat(url: str, body: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    path = "/v1/chat/completions" if key is None else f"/r/{key}/v1/chat/completions"
    status, answer = await post_json(url, path, body, headers)
    assert status == 200, answer
    return answer  # type: ignore[no-any-return]


async def _commit(proxy_url: str, version: str) -> None:
    async with aiohttp.ClientSession() as session:
        for route, body in (("begin", {"mode": "drain"}), ("commit", {"version": version})):
            async with session.post(f"{proxy_url}/v1/weights/{route}", json=body) as resp:
                assert resp.status == 200, await resp.text()


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) <= TOLERANCE


@pytest.mark.parametrize("salted", [True, False], ids=["salt", "reset"])
async def test_a_commit_without_model_path_leaves_no_stale_prefix(
    engine: EngineProcess, store: Store, tmp_path: Path, salted: bool
) -> None:
    model = engine.model
    ask = {**ASK, "model": model}
    new_weights = _changed(tmp_path / "new")
    async with running_proxy(store, engine.url, weight_version="1", cache_salt=salted) as proxy:
        _, key = await new_rollout(store, task_id="t")
        old = _logprobs(await _chat(proxy.url, ask, key))
        # The same prompt unsalted, straight to the engine: cached under no salt, old weights.
        assert _close(_logprobs(await _chat(engine.url, ask)), old)
        hits = (await engine_stats(engine.url))["prefix_cache_hits"]
        again = _logprobs(await _chat(proxy.url, ask, key))
        assert _close(again, old)
        if salted:
            after = (await engine_stats(engine.url))["prefix_cache_hits"]
            assert after > hits, "calls under one version share their prefixes"

        # The trainer pushes weights its own way: no flush, no model_path at the commit.
        status, loaded = await post_json(
            engine.url,
            "/update_weights_from_disk",
            {"model_path": str(new_weights), "flush_cache": False, "weight_version": "2"},
        )
        assert status == 200, loaded
        assert loaded["success"], loaded
        if salted:
            # Unsalted, as every call was before: the old K/V answer for the new weights.
            stale = _logprobs(await _chat(engine.url, ask))
        await _commit(proxy.url, "2")
        served = _logprobs(await _chat(proxy.url, ask, key))

    with EngineProcess.start() as fresh:
        status, loaded = await post_json(
            fresh.url, "/update_weights_from_disk", {"model_path": str(new_weights)}
        )
        assert status == 200, loaded
        assert loaded["success"], loaded
        expected = _logprobs(await _chat(fresh.url, ask))

    assert not _close(expected, old), "the new weights must change these logprobs"
    assert _close(served, expected), (served, expected)
    if salted:
        assert not _close(stale, expected), "an unsalted call reads K/V of the old weights"
