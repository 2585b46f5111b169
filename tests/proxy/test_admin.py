"""The admin API, pause/resume with weight versions, metrics, open mode, and isolation."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from rolltap.store import Store
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import OpenAIFactory, fake_engine, running_proxy

MESSAGES = [{"role": "user", "content": "hello"}]


async def _json(
    session: aiohttp.ClientSession, method: str, url: str, **kwargs: Any
) -> tuple[int, Any]:
    async with session.request(method, url, **kwargs) as resp:
        return resp.status, await resp.json()


async def test_rollouts_through_the_admin_api(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        async with aiohttp.ClientSession() as session:
            status, created = await _json(
                session,
                "POST",
                f"{proxy.url}/admin/rollouts",
                json={"task_id": "t1", "batch_id": "b", "sample_index": 0, "max_calls": 5},
            )
            assert status == 201
            assert created["base_url"] == f"{proxy.url}/r/{created['key']}/v1"

            client = sdk(created["base_url"])
            await client.chat.completions.create(model="m", messages=MESSAGES)

            status, shown = await _json(
                session, "GET", f"{proxy.url}/admin/rollouts/{created['id']}"
            )
            assert status == 200
            assert (shown["task_id"], shown["status"], shown["n_calls"]) == ("t1", "running", 1)
            assert shown["backend"] == engine.url
            assert "key" not in shown
            assert "key_hash" not in shown

            status, done = await _json(
                session,
                "PATCH",
                f"{proxy.url}/admin/rollouts/{created['id']}",
                json={"status": "finished", "reward": 1.0},
            )
            assert (status, done["status"], done["reward"]) == (200, "finished", 1.0)
            status, error = await _json(
                session,
                "PATCH",
                f"{proxy.url}/admin/rollouts/{created['id']}",
                json={"status": "done"},
            )
            assert (status, error["error"]["message"]) == (
                400,
                "status 'done' is not one of pending, running, finished, failed, timed_out, "
                "cancelled, budget_exceeded, expired",
            )
            # An ended rollout stays ended (store/lifecycle.py): 409 in the API's shape.
            status, error = await _json(
                session,
                "PATCH",
                f"{proxy.url}/admin/rollouts/{created['id']}",
                json={"status": "failed"},
            )
            assert (status, error["error"]["code"]) == (409, "illegal_transition")
            assert "is finished: it cannot become failed" in error["error"]["message"]

            status, error = await _json(session, "GET", f"{proxy.url}/admin/rollouts/nope")
            assert status == 404
            assert error["error"]["type"] == "not_found_error"
            status, error = await _json(
                session, "POST", f"{proxy.url}/admin/rollouts", json={"task_id": 3}
            )
            assert status == 400
            assert error["error"]["param"] == "task_id"


async def test_admin_token_guards_the_admin_api(store: Store) -> None:
    async with (
        fake_engine() as engine,
        running_proxy(store, engine.url, admin_token="s3cret-admin") as proxy,
    ):
        async with aiohttp.ClientSession() as session:
            status, error = await _json(session, "POST", f"{proxy.url}/admin/rollouts", json={})
            assert status == 401
            assert "s3cret" not in str(error)
            status, _ = await _json(
                session,
                "POST",
                f"{proxy.url}/admin/rollouts",
                json={},
                headers={"Authorization": "Bearer wrong"},
            )
            assert status == 401
            status, created = await _json(
                session,
                "POST",
                f"{proxy.url}/admin/rollouts",
                json={},
                headers={"Authorization": "Bearer s3cret-admin"},
            )
            assert status == 201
            assert created["key"].startswith("rk-")


async def test_pause_holds_new_calls_lets_inflight_finish_and_stamps_versions(
    store: Store, sdk: OpenAIFactory
) -> None:
    fake = FakeVLLM(script=lambda body: Reply(text="slow answer", token_delay=0.02))
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, engine.url, weight_version="v1") as proxy,
    ):
        created = await store.create_rollout()
        client = sdk(f"{proxy.url}/r/{created.key}/v1")
        inflight = asyncio.create_task(client.chat.completions.create(model="m", messages=MESSAGES))
        while proxy.ctx.hold.inflight == 0:  # the call is with the engine
            await asyncio.sleep(0.01)
        async with aiohttp.ClientSession() as session:
            status, paused = await _json(session, "POST", f"{proxy.url}/admin/pause?wait=10")
            # The in-flight call finished before pause answered; nothing was failed.
            assert (status, paused["drained"], paused["inflight"]) == (200, True, 0)
            assert (await inflight).choices[0].message.content == "slow answer"

            held = asyncio.create_task(client.chat.completions.create(model="m", messages=MESSAGES))
            await asyncio.sleep(0.3)
            assert not held.done()
            assert len(fake.requests) == 1
            _, status_doc = await _json(session, "GET", f"{proxy.url}/admin/status")
            assert status_doc["waiting"] == 1

            await _json(session, "POST", f"{proxy.url}/admin/resume", json={"weight_version": "v2"})
            assert (await held).choices[0].message.content == "slow answer"

        versions = [c.weight_version for c in await store.calls(created.id)]
        assert versions == ["v1", "v2"]


async def test_metrics_and_health(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        created = await store.create_rollout()
        client = sdk(f"{proxy.url}/r/{created.key}/v1", max_retries=0)
        await client.chat.completions.create(model="m", messages=MESSAGES)
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="m", messages=[])

        async with aiohttp.ClientSession() as session:
            async with session.get(f"{proxy.url}/metrics") as resp:
                text = await resp.text()
            async with session.get(f"{proxy.url}/health") as resp:
                assert resp.status == 200
                assert (await resp.json())["healthy_backends"] == 1

        assert 'rolltap_calls_total{dialect="chat",status="ok"} 1.0' in text
        assert 'rolltap_calls_total{dialect="chat",status="rejected"} 1.0' in text
        assert f'rolltap_backend_inflight{{backend="{engine.url}"}} 0' in text
        assert 'rolltap_proxy_overhead_seconds_count{dialect="chat"} 1' in text
        assert "rolltap_call_seconds_bucket" in text


async def test_open_mode_creates_a_rollout_per_unknown_key(
    store: Store, sdk: OpenAIFactory
) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url, open_mode=True) as proxy:
        for key in ("experiment-a", "experiment-b", "experiment-a"):
            await sdk(f"{proxy.url}/v1", api_key=key).chat.completions.create(
                model="m", messages=MESSAGES
            )

        rollouts = await store.rollouts()
        assert sorted(r.n_calls for r in rollouts) == [1, 2]
        assert all(r.meta == {"created_by": "open"} for r in rollouts)


async def test_an_unknown_key_is_told_about_open_mode(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        with pytest.raises(openai.AuthenticationError) as refused:
            await sdk(f"{proxy.url}/v1", api_key="made-up").chat.completions.create(
                model="m", messages=MESSAGES
            )
    assert refused.value.status_code == 401
    assert refused.value.body["message"] == (  # type: ignore[index]
        "unknown rollout key: use the key POST /admin/rollouts returned, or start "
        "`rolltap serve --open` to make a rollout for any key (local experiments)"
    )
    assert await store.rollouts() == []


async def test_two_rollouts_never_see_each_others_data(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        a = await store.create_rollout()
        b = await store.create_rollout()
        await asyncio.gather(
            *(
                sdk(f"{proxy.url}/r/{created.key}/v1").chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"I am {name} #{i}"}]
                )
                for i in range(5)
                for created, name in ((a, "A"), (b, "B"))
            )
        )
        # The key in the header must not override the key in the path, nor the reverse.
        await sdk(f"{proxy.url}/r/{a.key}/v1", api_key=b.key).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "I am A #5"}]
        )

        for created, name, count in ((a, "A", 6), (b, "B", 5)):
            calls = await store.calls(created.id)
            assert len(calls) == count
            for call in calls:
                request = (await store.call_bodies(call.id)).request or b""
                assert f"I am {name}".encode() in request
                assert {"A": b"I am B", "B": b"I am A"}[name] not in request


async def test_unix_socket_serves_rollouts_but_not_the_admin_api(
    store: Store, tmp_path: Path
) -> None:
    sock = str(tmp_path / "proxy.sock")
    async with fake_engine() as engine, running_proxy(store, engine.url, unix_socket=sock) as _:
        created = await store.create_rollout()
        connector = aiohttp.UnixConnector(path=sock)
        async with aiohttp.ClientSession(connector=connector) as session:
            status, reply = await _json(
                session,
                "POST",
                f"http://sandbox/r/{created.key}/v1/chat/completions",
                json={"messages": MESSAGES},
            )
            assert status == 200
            assert reply["choices"][0]["message"]["content"] == "echo: hello"
            for method, path in (("POST", "/admin/rollouts"), ("GET", "/metrics")):
                async with session.request(method, f"http://sandbox{path}") as resp:
                    assert resp.status == 404


async def test_trajectory_of_a_finished_rollout(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        created = await store.create_rollout()
        client = sdk(f"{proxy.url}/r/{created.key}/v1")
        history: list[Any] = [{"role": "user", "content": "turn 0"}]
        for turn in range(1, 4):
            reply = await client.chat.completions.create(model="m", messages=history)
            history += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": f"turn {turn}"},
            ]
        async with aiohttp.ClientSession() as session:
            await _json(
                session,
                "PATCH",
                f"{proxy.url}/admin/rollouts/{created.id}",
                json={"status": "finished", "reward": 0.5},
            )
            status, doc = await _json(
                session, "GET", f"{proxy.url}/admin/rollouts/{created.id}/trajectory"
            )

        assert status == 200
        (trajectory,) = doc["trajectories"]
        assert trajectory["reward"] == 0.5
        assert doc["faithfulness"]["share"] == 1.0
        tokens = list((await store.rollout_tokens(created.id)).values())
        assert trajectory["prompt_ids"] == tokens[0].prompt_ids.tolist()
        full = trajectory["prompt_ids"] + trajectory["response_ids"]
        last = tokens[-1]
        assert full == last.prompt_ids.tolist() + last.choices[0].token_ids.tolist()
        sampled = [
            t for t, m in zip(trajectory["response_ids"], trajectory["loss_mask"], strict=True) if m
        ]
        assert sampled == [i for t in tokens for i in t.choices[0].token_ids.tolist()]
