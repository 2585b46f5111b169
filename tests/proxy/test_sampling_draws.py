"""Samples a trainer can trust, on fake vLLM and SGLang engines: a batch seed reaches the engine
as a seed derived per sample and call (every dialect, streaming, token-in routes), a harness's
own seed is left alone, and every vLLM-dialect call is salted with the weight version it was
dispatched under; commits flush the caches that cannot be salted."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from rolltap.proxy.upstream.sampling import cache_salt, derived_seed
from rolltap.store import Store
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import fake_engine, new_rollout, running_proxy

BATCH_SEED = 1234
SAMPLING = {"temperature": 1.0, "seed": BATCH_SEED}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
DIALECTS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("chat/completions", CHAT),
    "chat-stream": ("chat/completions", {**CHAT, "stream": True}),
    "responses": ("responses", {"model": "m", "input": "hi", "max_output_tokens": 8}),
    "messages-stream": (
        "messages",
        {**CHAT, "stream": True},
    ),
}


async def _post(url: str, key: str, path: str, body: dict[str, Any]) -> int:
    headers = {"Authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/r/{key}/v1/{path}", json=body, headers=headers) as resp:
            await resp.read()
            return resp.status


def _engine_bodies(fake: FakeVLLM) -> list[dict[str, Any]]:
    return [body for path, _, body in fake.requests if path != "/tokenize"]


def _seed_of(body: dict[str, Any]) -> Any:
    if "sampling_params" in body:  # SGLang's /generate
        return body["sampling_params"].get("sampling_seed")
    return body.get("seed")


@pytest.mark.parametrize("backend", ["vllm", "sglang", "vllm-token-in", "sglang-token-in"])
async def test_a_batch_seed_becomes_one_seed_per_sample_and_call(
    store: Store, backend: str
) -> None:
    fake = FakeVLLM(sglang=backend.startswith("sglang"), completion_text="ok")
    spec = "sglang={}" if fake.sglang else "{}"
    token_in = backend.endswith("token-in")
    async with fake_engine(fake) as engine, running_proxy(store, spec.format(engine.url)) as proxy:
        expected: list[int] = []
        for sample in range(3):
            _, key = await new_rollout(
                store,
                task_id="task-a",
                sample_index=sample,
                attempt=1,
                meta={"sampling": SAMPLING, "token_in": token_in},
            )
            for place, (path, body) in enumerate(DIALECTS.values()):
                assert await _post(proxy.url, key, path, body) == 200
                expected.append(derived_seed(BATCH_SEED, "task-a", sample, place, 1))

    seeds = [_seed_of(b) for b in _engine_bodies(fake)]
    assert seeds == expected
    assert len(set(seeds)) == len(seeds), "every sample and every call draws its own"
    assert all(0 <= s < 2**31 for s in seeds)
    # The engine request is the record of what was sampled with.
    calls = [c for r in await store.rollouts() for c in await store.calls(r.id)]
    recorded = {
        _seed_of(orjson.loads((await store.call_bodies(c.id)).engine_request or b"{}"))
        for c in calls
    }
    assert recorded == set(expected)


def test_the_derivation_is_the_documented_function() -> None:
    # BLAKE2b-64 of the fields joined by 0x1f, its first 31 bits (proxy/upstream/sampling.py).
    import hashlib

    material = "\x1f".join(["rolltap-seed-1", "7", "t", "2", "5", "0"]).encode()
    digest = hashlib.blake2b(material, digest_size=8).digest()
    assert derived_seed(7, "t", 2, 5, 0) == int.from_bytes(digest, "big") >> 33
    draws = {derived_seed(7, "t", s, p, a) for s in range(8) for p in range(8) for a in range(2)}
    assert len(draws) == 128
    assert derived_seed(8, "t", 2, 5, 0) != derived_seed(7, "t", 2, 5, 0)
    assert derived_seed(7, "u", 2, 5, 0) != derived_seed(7, "t", 2, 5, 0)


async def test_a_harness_seed_is_left_alone_unless_the_batch_imposes_one(store: Store) -> None:
    fake = FakeVLLM(script=lambda body: Reply(text="two"))
    async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
        _, free = await new_rollout(store, task_id="t", meta={"sampling": {"temperature": 0.5}})
        _, seeded = await new_rollout(store, task_id="t", meta={"sampling": SAMPLING})
        body = {**CHAT, "seed": 99, "n": 2}
        assert await _post(proxy.url, free, "chat/completions", body) == 200
        assert await _post(proxy.url, seeded, "chat/completions", body) == 200

    (first, second) = _engine_bodies(fake)
    assert (first["seed"], first["temperature"], first["n"]) == (99, 0.5, 2)
    assert second["seed"] == derived_seed(BATCH_SEED, "t", 0, 0, 0)
    assert second["n"] == 2, "n > 1 keeps working: the engine derives one stream per choice"


async def _weights(url: str, route: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/weights/{route}", json=body) as resp:
            return resp.status, await resp.json()


async def _update(url: str, version: str) -> tuple[int, dict[str, Any]]:
    status, _ = await _weights(url, "begin", {"mode": "drain"})
    assert status == 200
    return await _weights(url, "commit", {"version": version})


async def test_calls_are_salted_with_their_version_and_sglang_is_flushed_at_commit(
    store: Store,
) -> None:
    vllm, sglang = FakeVLLM(), FakeVLLM(sglang=True)
    async with (
        fake_engine(vllm) as v,
        fake_engine(sglang) as s,
        running_proxy(store, v.url, weight_version="1") as on_vllm,
        running_proxy(store, f"sglang={s.url}", weight_version="1") as on_sglang,
    ):
        _, key = await new_rollout(store, task_id="t")
        for proxy in (on_vllm, on_sglang):
            assert await _post(proxy.url, key, "chat/completions", CHAT) == 200
            own = {**CHAT, "cache_salt": "tenant-9", "stream": True}
            assert await _post(proxy.url, key, "chat/completions", own) == 200
            status, committed = await _update(proxy.url, "2")
            assert status == 200, committed
            assert await _post(proxy.url, key, "chat/completions", CHAT) == 200
            assert await _post(proxy.url, key, "messages", {**CHAT, "stream": True}) == 200

        salts = [b.get("cache_salt") for b in _engine_bodies(vllm)]
        assert salts == ["rolltap-w:1", "tenant-9|rolltap-w:1", "rolltap-w:2", "rolltap-w:2"]
        assert salts[0] == cache_salt("1")
        assert vllm.cache_resets == [], "salted calls need no reset"
        # SGLang takes no salt: its prefix cache is emptied at the commit instead.
        assert [b.get("cache_salt") for b in _engine_bodies(sglang)] == [None, "tenant-9"] + [
            None
        ] * 2
        assert sglang.cache_resets == ["/flush_cache"]


async def test_without_salts_a_commit_resets_vllm_and_a_failed_reset_keeps_calls_held(
    store: Store,
) -> None:
    fake = FakeVLLM()
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, engine.url, weight_version="1", cache_salt=False) as proxy,
    ):
        _, key = await new_rollout(store, task_id="t")
        assert await _post(proxy.url, key, "chat/completions", CHAT) == 200
        status, _ = await _update(proxy.url, "2")
        assert status == 200
        assert fake.cache_resets == ["/reset_prefix_cache"]
        assert "cache_salt" not in _engine_bodies(fake)[0]
        # A client's empty salt means none; vLLM's Rust frontend refuses it (vllm#53218).
        assert await _post(proxy.url, key, "chat/completions", {**CHAT, "cache_salt": ""}) == 200
        assert "cache_salt" not in _engine_bodies(fake)[-1]
        own = {**CHAT, "cache_salt": "tenant-9"}
        assert await _post(proxy.url, key, "chat/completions", own) == 200
        assert _engine_bodies(fake)[-1]["cache_salt"] == "tenant-9"

        fake.refuse_cache_reset = True
        status, answer = await _update(proxy.url, "3")
        assert status == 502
        assert answer["error"]["code"] == "cache_flush_failed"
        assert proxy.ctx.hold.paused, "no call may run on a cache of the old weights"
        assert any("refused" in b["detail"] for b in answer["backends"])
        status, cancelled = await _weights(proxy.url, "cancel", {})
        assert (status, cancelled["weight_version"]) == (200, "2")
