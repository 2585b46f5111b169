"""POST /update_weights_from_disk on the real SmolLM2 engine: new weights change what it samples
and the label it reports, the prefix cache never serves keys/values of old weights, in-flight
requests either finish on the old weights or end with "abort" and what they sampled, and bad
weights change nothing.

These tests change the engine's weights, so they run their own engine process, not the
session's shared one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rolltap.engine.launch import EngineProcess
from tests.support.engine import get_json, post_json, post_sse
from tests.support.waiting import until
from tests.support.weights import CHANGED, changed_weights, save_weights, served_weights

pytestmark = pytest.mark.model

PROMPT = [1, 9690, 314, 253, 1345, 30, 2]
SAME = 1e-4
"""Two runs of the same weights on the same prompt: float noise only (see the prefix tests)."""


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineProcess]:
    process = EngineProcess.start(extra_args=("--weight-version", "v0"))
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def weights(engine: EngineProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("weights")
    original = served_weights()
    tied = {k: v for k, v in original.items() if k != "lm_head.weight"}
    pt_file = root / "changed.pt"
    torch.save(changed_weights(0.5), pt_file)
    return {
        "original": save_weights(tied, root / "original"),
        "changed": save_weights(changed_weights(1.5), root / "changed"),
        "changed_pt": pt_file,
    }


async def greedy(engine: EngineProcess, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    body = {
        "model": engine.model,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": 0,
        "return_token_ids": True,
        "return_weight_versions": True,
        **extra,
    }
    status, answer = await post_json(engine.url, "/v1/completions", body)
    assert status == 200, answer
    choice: dict[str, Any] = answer["choices"][0]
    return choice


async def update(engine: EngineProcess, path: Path, version: str | None, **extra: Any) -> Any:
    body: dict[str, Any] = {"model_path": str(path), **extra}
    if version is not None:
        body["weight_version"] = version
    return await post_json(engine.url, "/update_weights_from_disk", body)


async def set_weights(engine: EngineProcess, path: Path, version: str) -> None:
    status, answer = await update(engine, path, version)
    assert (status, answer["success"]) == (200, True), answer


async def test_new_weights_change_logprobs_and_the_version_and_the_cache_is_flushed(
    engine: EngineProcess, weights: dict[str, Path]
) -> None:
    await set_weights(engine, weights["original"], "base")
    before = await greedy(engine)
    assert before["weight_versions"] == [{"version": "base", "start": 0, "end": 8}]

    status, answer = await update(engine, weights["changed"], "v1")

    assert status == 200
    assert answer["success"] is True
    assert answer["weight_version"] == "v1"
    after = await greedy(engine)
    assert after["weight_versions"] == [{"version": "v1", "start": 0, "end": 8}]
    moved = max(
        abs(a - b)
        for a, b in zip(
            after["logprobs"]["token_logprobs"], before["logprobs"]["token_logprobs"], strict=False
        )
    )
    assert moved > 0.01, f"scaling {CHANGED} moved logprobs by only {moved}"
    assert (await get_json(engine.url, "/get_weight_version"))[1] == {"weight_version": "v1"}

    # Back to the original weights: the same prompt, cached under the changed weights a moment
    # ago, must answer exactly as before, so the cache was emptied at the update.
    await set_weights(engine, weights["original"], "v2")
    again = await greedy(engine)
    assert again["token_ids"] == before["token_ids"]
    assert again["logprobs"]["token_logprobs"] == pytest.approx(
        before["logprobs"]["token_logprobs"], abs=SAME
    )


async def test_a_torch_state_dict_file_loads_too(
    engine: EngineProcess, weights: dict[str, Path]
) -> None:
    await set_weights(engine, weights["original"], "base")
    before = await greedy(engine)

    await set_weights(engine, weights["changed_pt"], "pt")

    after = await greedy(engine)
    assert after["weight_versions"][0]["version"] == "pt"
    assert after["logprobs"]["token_logprobs"] != pytest.approx(
        before["logprobs"]["token_logprobs"], abs=SAME
    )


async def test_running_requests_finish_on_the_old_weights_while_new_ones_wait(
    engine: EngineProcess, weights: dict[str, Path]
) -> None:
    await set_weights(engine, weights["original"], "old")
    body = {
        "model": engine.model,
        "prompt": PROMPT,
        "max_tokens": 24,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "return_token_ids": True,
        "return_weight_versions": True,
    }
    running = asyncio.ensure_future(post_sse(engine.url, "/v1/completions", body))
    await _until_running(engine)

    status, answer = await update(engine, weights["changed"], "new")
    chunks = await running

    assert status == 200
    assert answer["success"] is True
    ids = [i for c in chunks for choice in c["choices"] for i in choice.get("token_ids", [])]
    assert len(ids) == 24
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "length"
    assert last["weight_versions"] == [{"version": "old", "start": 0, "end": 24}]
    assert (await greedy(engine))["weight_versions"][0]["version"] == "new"


async def test_abort_all_requests_ends_running_ones_with_what_they_sampled(
    engine: EngineProcess, weights: dict[str, Path]
) -> None:
    await set_weights(engine, weights["original"], "before-abort")
    body = {
        "model": engine.model,
        "messages": [{"role": "user", "content": "Count from one to one hundred."}],
        "max_tokens": 400,
        "ignore_eos": True,
        "temperature": 0,
        "logprobs": True,
        "return_token_ids": True,
        "return_weight_versions": True,
    }
    running = asyncio.ensure_future(post_json(engine.url, "/v1/chat/completions", body))
    await _until_running(engine)

    status, answer = await update(
        engine, weights["changed"], "after-abort", abort_all_requests=True
    )
    chat_status, chat = await running

    assert (status, answer["success"]) == (200, True)
    assert answer["num_aborted_requests"] == 1
    assert chat_status == 200
    choice = chat["choices"][0]
    assert choice["finish_reason"] == "abort"
    n = len(choice["token_ids"])
    assert 0 < n < 400
    assert len(choice["logprobs"]["content"]) == n
    assert choice["weight_versions"] == [{"version": "before-abort", "start": 0, "end": n}]
    assert (await greedy(engine))["weight_versions"][0]["version"] == "after-abort"


async def test_bad_weights_are_refused_and_change_nothing(
    engine: EngineProcess, weights: dict[str, Path], tmp_path: Path
) -> None:
    await set_weights(engine, weights["original"], "good")
    before = await greedy(engine)
    norm = served_weights()[CHANGED]
    nan = norm.clone()
    nan[0] = float("nan")
    bad = {
        "unknown_tensor": ({"model.extra.weight": torch.zeros(2)}, "does not have"),
        "wrong_shape": ({CHANGED: torch.ones(7)}, "shape"),
        "nan": ({CHANGED: nan}, "NaN"),
        "left_out": ({CHANGED: norm}, "leave out"),
    }
    paths = {"missing": (tmp_path / "nowhere", "neither a file nor a directory")}
    for name, (tensors, message) in bad.items():
        paths[name] = (save_weights(tensors, tmp_path / name), message)

    for name, (path, message) in paths.items():
        status, answer = await update(engine, path, "bad")

        assert status == 400, name
        assert answer["success"] is False, name
        assert message in answer["message"], (name, answer["message"])
        assert answer["weight_version"] == "good", name
    after = await greedy(engine)
    assert after["weight_versions"][0]["version"] == "good"
    assert after["logprobs"]["token_logprobs"] == pytest.approx(
        before["logprobs"]["token_logprobs"], abs=SAME
    )


async def test_abort_requests_route_ends_everything_with_abort(engine: EngineProcess) -> None:
    body = {
        "model": engine.model,
        "prompt": PROMPT,
        "max_tokens": 400,
        "ignore_eos": True,
        "temperature": 0,
        "return_token_ids": True,
    }
    running = asyncio.ensure_future(post_json(engine.url, "/v1/completions", body))
    await _until_running(engine)

    status, _ = await post_json(engine.url, "/abort_requests", {})
    answer_status, answer = await running

    assert status == 200
    assert answer_status == 200
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "abort"
    assert 0 < len(choice["token_ids"]) < 400


async def _until_running(engine: EngineProcess) -> None:
    async def decoding() -> bool:
        stats = (await get_json(engine.url, "/stats"))[1]
        return bool(stats["running"] and stats["generated_tokens"] > 0)

    await until(decoding, "the request started decoding", timeout=12)


async def test_the_engine_serves_vllms_rl_control_plane(
    engine: EngineProcess, weights: dict[str, Path]
) -> None:
    """The routes the proxy drives on a vLLM-kind backend (proxy/control/engine_control.py), in
    vLLM 0.33's shapes: pause and resume, the version set and read back, and per-parameter
    checksums that move with the weights."""
    await set_weights(engine, weights["original"], "base")
    status, refused = await post_json(engine.url, "/pause?mode=keep", {})
    assert status == 400
    assert "does not freeze running requests" in refused["error"]
    assert await post_json(engine.url, "/pause?mode=wait", {}) == (200, {"status": "paused"})
    assert await get_json(engine.url, "/is_paused") == (200, {"is_paused": True})
    assert await post_json(engine.url, "/resume", {}) == (200, {"status": "resumed"})
    assert await get_json(engine.url, "/is_paused") == (200, {"is_paused": False})

    labelled = await post_json(engine.url, "/update_weight_version", {"new_version": "v7"})
    assert labelled == (200, {"success": True, "new_version": "v7"})
    assert await get_json(engine.url, "/weight_info") == (200, {"weight_version": "v7"})
    finished = await post_json(engine.url, "/finish_weight_update", {"weight_version": "v8"})
    assert finished[0] == 200
    assert await get_json(engine.url, "/weight_info") == (200, {"weight_version": "v8"})
    status, _ = await post_json(engine.url, "/update_weights", {"update_info": {}})
    assert status == 400

    status, base = await post_json(engine.url, "/weight_checker", {"action": "checksum"})
    assert status == 200
    sums = base["checksums"]
    assert CHANGED in sums
    assert all(len(v) == 64 for v in sums.values())
    await set_weights(engine, weights["changed"], "v9")
    status, compared = await post_json(
        engine.url, "/weight_checker", {"action": "compare", "baseline": sums}
    )
    assert (status, compared) == (200, {"match": False, "mismatches": [CHANGED]})
    await set_weights(engine, weights["original"], "base")
    status, same = await post_json(
        engine.url, "/weight_checker", {"action": "compare", "baseline": sums}
    )
    assert (status, same) == (200, {"match": True, "mismatches": []})
