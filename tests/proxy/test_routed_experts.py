"""MoE routing replay (R3): with --capture-routed-experts the proxy asks each engine for the
experts every token was routed to, in its own wire format (proxy/upstream/routed.py), stores
exactly what
it sent, hides it from the client, and says so when the engine sent none."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt
import orjson
import pytest

from rolltap.analysis.reading import rollout_trajectories
from rolltap.store import CallStatus, Capture, Store
from rolltap.store.events import Declared
from tests.support.cli import rolltap
from tests.support.fake_vllm import FakeVLLM, Reply, render, routed_experts
from tests.support.proxy import OpenAIFactory, fake_engine, new_rollout, running_proxy

LAYERS, TOPK, EXPERTS = 3, 2, 64
MESSAGES = [{"role": "user", "content": "route me"}]


def _expected(prompt: list[int], answer: list[int], sglang: bool) -> npt.NDArray[Any]:
    """What the engine sent: vLLM tokens-1 x layers x top-k; SGLang the same rows flattened."""
    rows = routed_experts([*prompt, *answer], LAYERS, TOPK, EXPERTS)
    return rows.reshape(len(rows), -1) if sglang else rows


async def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        return resp.status, await resp.read()


async def _only_call_routing(store: Store, rollout_id: str) -> tuple[Any, npt.NDArray[Any]]:
    (call,) = await store.calls(rollout_id)
    routing = await store.routed_experts(rollout_id)
    assert set(routing) == {(call.id, 0)}
    return call, routing[(call.id, 0)]


@pytest.mark.parametrize("sglang", [False, True], ids=["vllm", "sglang"])
async def test_whole_chat_answer_routing_is_stored_as_sent_and_hidden(
    store: Store, sdk: OpenAIFactory, sglang: bool
) -> None:
    fake = FakeVLLM(sglang=sglang, moe=(LAYERS, TOPK, EXPERTS))
    backend = "sglang=" if sglang else ""
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, backend + engine.url, capture_routed_experts=True) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")
        reply = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]

    # The client sees none of it: neither vLLM's per-choice field nor SGLang's meta_info.
    assert "routed_experts" not in (reply.choices[0].model_extra or {})
    assert "sglext" not in (reply.model_extra or {})
    _, _, sent = fake.requests[-1]
    # SGLang is asked per request; vLLM has no request field (its server flag decides).
    assert sent.get("return_routed_experts") is (True if sglang else None)
    call, stored = await _only_call_routing(store, rollout_id)
    tokens = await store.call_tokens(call.id)
    prompt, answer = tokens.prompt_ids.tolist(), tokens.choices[0].token_ids.tolist()
    assert prompt == render(MESSAGES, None)
    expected = _expected(prompt, answer, sglang)
    assert stored.dtype == np.uint8  # every expert id < 256
    assert stored.shape == expected.shape == (len(prompt) + len(answer) - 1, *expected.shape[1:])
    assert np.array_equal(stored, expected)
    assert call.error is None


async def test_sglang_stream_routing_comes_in_its_sglext_chunk(
    store: Store, sdk: OpenAIFactory
) -> None:
    fake = FakeVLLM(sglang=True, moe=(LAYERS, TOPK, EXPERTS))
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, f"sglang={engine.url}", capture_routed_experts=True) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        chunks = [c async for c in stream]

    assert all("sglext" not in (c.model_extra or {}) for c in chunks)
    call, stored = await _only_call_routing(store, rollout_id)
    tokens = await store.call_tokens(call.id)
    expected = _expected(tokens.prompt_ids.tolist(), tokens.choices[0].token_ids.tolist(), True)
    assert np.array_equal(stored, expected)


async def test_vllm_stream_has_no_routing_and_the_call_says_so(
    store: Store, sdk: OpenAIFactory
) -> None:
    fake = FakeVLLM(moe=(LAYERS, TOPK, EXPERTS))
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, engine.url, capture_routed_experts=True) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    assert text == "echo: route me"
    (call,) = await store.calls(rollout_id)
    assert (call.status, call.capture) == (CallStatus.OK, Capture.TOKENS)
    assert await store.routed_experts(rollout_id) == {}  # nothing made up
    assert call.error is not None
    assert "vLLM sends none on a stream" in call.error


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_anthropic_messages_calls_capture_routing_too(store: Store, stream: bool) -> None:
    fake = FakeVLLM(sglang=True, moe=(LAYERS, TOPK, EXPERTS))
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, f"sglang={engine.url}", capture_routed_experts=True) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        body = {"model": "claude", "max_tokens": 50, "messages": MESSAGES, "stream": stream}
        status, raw = await _post(f"{proxy.url}/r/{key}/v1/messages", body)

    assert status == 200
    assert b"routed_experts" not in raw
    assert b"sglext" not in raw
    call, stored = await _only_call_routing(store, rollout_id)
    tokens = await store.call_tokens(call.id)
    expected = _expected(tokens.prompt_ids.tolist(), tokens.choices[0].token_ids.tolist(), True)
    assert np.array_equal(stored, expected)


async def test_responses_call_on_vllm_captures_routing(store: Store) -> None:
    fake = FakeVLLM(moe=(LAYERS, TOPK, EXPERTS))
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, engine.url, capture_routed_experts=True) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        body = {"model": "m", "input": "route me"}
        status, raw = await _post(f"{proxy.url}/r/{key}/v1/responses", body)

    assert status == 200, raw
    assert b"routed_experts" not in raw
    call, stored = await _only_call_routing(store, rollout_id)
    tokens = await store.call_tokens(call.id)
    expected = _expected(tokens.prompt_ids.tolist(), tokens.choices[0].token_ids.tolist(), False)
    assert stored.shape == expected.shape
    assert np.array_equal(stored, expected)


async def test_expert_ids_past_255_are_stored_as_uint16(store: Store, sdk: OpenAIFactory) -> None:
    fake = FakeVLLM(moe=(2, 4, 1000))
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, engine.url, capture_routed_experts=True) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        await sdk(f"{proxy.url}/r/{key}/v1").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]

    call, stored = await _only_call_routing(store, rollout_id)
    tokens = await store.call_tokens(call.id)
    ids = [*tokens.prompt_ids.tolist(), *tokens.choices[0].token_ids.tolist()]
    assert stored.dtype == np.uint16
    assert np.array_equal(stored, routed_experts(ids, 2, 4, 1000))


async def test_a_rollout_asks_for_routing_itself(store: Store, sdk: OpenAIFactory) -> None:
    """The proxy's default is off; a rollout's meta (a batch's spec) turns it on for its calls."""
    fake = FakeVLLM(sglang=True, moe=(LAYERS, TOPK, EXPERTS))
    async with fake_engine(fake) as engine, running_proxy(store, f"sglang={engine.url}") as proxy:
        plain, plain_key = await new_rollout(store, task_id="plain")
        asked, asked_key = await new_rollout(store, task_id="r3", meta={"routed_experts": True})
        for key in (plain_key, asked_key):
            client = sdk(f"{proxy.url}/r/{key}/v1")
            await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]

    first, second = (body for _, _, body in fake.requests)
    assert "return_routed_experts" not in first
    assert second["return_routed_experts"] is True
    assert await store.routed_experts(plain) == {}
    assert len(await store.routed_experts(asked)) == 1


@pytest.mark.parametrize("dialect", ["chat", "messages"])
async def test_the_builtin_engine_is_refused_in_the_clients_shape(
    store: Store, dialect: str
) -> None:
    async with (
        fake_engine() as engine,
        running_proxy(store, engine.url, builtin_engine=True) as proxy,
    ):
        rollout_id, key = await new_rollout(store, meta={"routed_experts": True})
        if dialect == "chat":
            url, body = f"{proxy.url}/r/{key}/v1/chat/completions", {"messages": MESSAGES}
        else:
            url, body = f"{proxy.url}/r/{key}/v1/messages", {"max_tokens": 5, "messages": MESSAGES}
        status, raw = await _post(url, {"model": "m", **body})

    assert status == 400
    doc = orjson.loads(raw)
    if dialect == "chat":
        assert doc["error"]["code"] == "routed_experts_unavailable"
    else:
        assert (doc["type"], doc["error"]["type"]) == ("error", "invalid_request_error")
    assert "dense model" in doc["error"]["message"]
    assert engine.fake.requests == []
    (call,) = await store.calls(rollout_id)
    assert call.status is CallStatus.REJECTED


async def test_openai_backends_are_refused_when_a_rollout_is_created(store: Store) -> None:
    async with (
        fake_engine() as engine,
        running_proxy(store, f"openai={engine.url}", open_mode=True) as proxy,
    ):
        status, raw = await _post(
            f"{proxy.url}/admin/rollouts", {"task_id": "t", "routed_experts": True}
        )

    assert status == 400
    assert "openai=URL backend returns no routed experts" in orjson.loads(raw)["error"]["message"]


def test_serve_and_run_refuse_the_flag_on_the_builtin_engine(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "t", "instruction": "x", "test": "true"}\n')
    for args in (["serve", "--port", "0"], ["run", "tasks.jsonl"]):
        result = rolltap(tmp_path, *args, "--capture-routed-experts")
        assert result.returncode == 1, (result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("Error: --capture-routed-experts: the built-in engine runs a")
        assert "dense model" in lines[0]
    # Nothing was started or created by the mistake.
    assert not (tmp_path / "data").exists()
    backend = ["--backend", "openai=http://127.0.0.1:9"]
    result = rolltap(tmp_path, "serve", *backend, "--capture-routed-experts")
    assert result.returncode == 1
    assert "an openai=URL backend" in result.stderr


@pytest.mark.parametrize(
    ("sglang", "stream"),
    [(True, False), (True, True), (False, False)],
    ids=["sglang-generate-whole", "sglang-generate-stream", "vllm-completions"],
)
async def test_token_in_rollout_trajectory_parquet_and_atif_carry_aligned_routing(
    store: Store, sdk: OpenAIFactory, tmp_path: Path, sglang: bool, stream: bool
) -> None:
    """Three bridged turns: the trajectory's rows are its tokens' (row i routes token i of
    prompt_ids + response_ids), as are Parquet's and each ATIF step's."""
    fake = FakeVLLM(
        sglang=sglang,
        moe=(LAYERS, TOPK, EXPERTS),
        script=lambda body: Reply(text="I will look."),
        completion_script=lambda prompt: Reply(text="Looking."),
    )
    backend = "sglang=" if sglang else ""
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, backend + engine.url) as proxy,
    ):
        rollout_id, key = await new_rollout(
            store, task_id="t", meta={"token_in": True, "routed_experts": True}
        )
        client = sdk(f"{proxy.url}/r/{key}/v1")
        messages: list[Any] = [{"role": "user", "content": "what is here?"}]
        for turn in range(3):
            params: dict[str, Any] = {"model": "m", "messages": messages}
            if stream:
                chunks = await client.chat.completions.create(**params, stream=True)
                text = "".join(
                    [c.choices[0].delta.content or "" async for c in chunks if c.choices]
                )
            else:
                answer = await client.chat.completions.create(**params)
                text = answer.choices[0].message.content or ""
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"result {turn}"},
            ]
        calls = sorted(await store.calls(rollout_id), key=lambda c: c.seq)
        await store.report(rollout_id, Declared("succeeded"), reward=1.0)

    assert [c.bridge for c in calls] == ["first_turn", "bridged", "bridged"]
    paths = {path for path, _, _ in fake.requests}
    assert ("/generate" if sglang else "/v1/completions") in paths
    routing = await store.routed_experts(rollout_id)
    assert set(routing) == {(c.id, 0) for c in calls}  # every turn, bridged ones included
    (t,) = (await rollout_trajectories(store, rollout_id)).trajectories
    ids = [*t.prompt_ids.tolist(), *t.response_ids.tolist()]
    assert t.call_ids == tuple(c.id for c in calls)
    assert t.routed_experts is not None
    assert t.routed_experts.shape[0] == len(ids) - 1
    assert np.array_equal(t.routed_experts, _expected(ids[:1], ids[1:], sglang))

    from rolltap.export.atif import rollout_atif
    from rolltap.export.export import open_writer, write_all
    from tests.support.atif_spec import check

    path = tmp_path / "r3.parquet"
    writer = open_writer("parquet", path)
    write_all([await rollout_trajectories(store, rollout_id)], writer)
    writer.close()
    import pyarrow.parquet as pq

    (row,) = pq.read_table(path).to_pylist()
    assert row["routed_experts"] == t.routed_experts.tobytes()
    assert (row["routed_experts_dtype"], row["routed_experts_shape"]) == (
        "uint8",
        list(t.routed_experts.shape),
    )

    doc = await rollout_atif(store, rollout_id)
    assert doc is not None
    check(doc)
    steps = [s for s in doc["steps"] if "metrics" in s]
    assert len(steps) == 3
    for step in steps:
        got = step["metrics"]["extra"]["routed_experts"]
        array = np.frombuffer(base64.b64decode(got["data"]), dtype=got["dtype"])
        assert np.array_equal(
            array.reshape(got["shape"]), routing[(step["extra"]["rolltap"]["call_id"], 0)]
        )
