"""/v1/weights: a weight update holds new calls without failing any, lets in-flight calls finish
on the old weights (drain), loads new weights into the engines, and stamps every call with the
version it was sampled with; failures keep dispatching held; versions are ordered by commit."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from rolltap.store import CallStatus, Store
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import OpenAIFactory, fake_engine, running_proxy
from tests.support.waiting import until

MESSAGES = [{"role": "user", "content": "hello"}]


async def _json(
    session: aiohttp.ClientSession, method: str, url: str, **kwargs: Any
) -> tuple[int, Any]:
    async with session.request(method, url, **kwargs) as resp:
        return resp.status, await resp.json()


async def test_drain_holds_new_calls_lets_inflight_finish_and_fails_none(
    store: Store, sdk: OpenAIFactory
) -> None:
    fake = FakeVLLM(script=lambda body: Reply(text="a slow answer", token_delay=0.03))
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, engine.url, weight_version="1") as proxy,
    ):
        created = await store.create_rollout()
        client = sdk(f"{proxy.url}/r/{created.key}/v1", max_retries=0)
        stream_body = {"model": "m", "messages": MESSAGES}
        before = [
            asyncio.create_task(client.chat.completions.create(**stream_body)),  # type: ignore[call-overload]
            asyncio.create_task(client.chat.completions.create(**stream_body, stream=True)),  # type: ignore[call-overload]
        ]
        await until(lambda: proxy.ctx.hold.inflight == 2)
        async with aiohttp.ClientSession() as session:
            begin = asyncio.create_task(
                _json(session, "POST", f"{proxy.url}/v1/weights/begin", json={"mode": "drain"})
            )
            await until(lambda: proxy.ctx.hold.paused)
            held = [
                asyncio.create_task(client.chat.completions.create(model="m", messages=MESSAGES))
                for _ in range(3)
            ]
            await until(lambda: proxy.ctx.hold.waiting == 3)
            status, began = await begin
            assert (status, began["drained"], began["inflight"]) == (200, True, 0)
            assert began["update"] == {"mode": "drain"}
            assert all(task.done() for task in before)
            assert not any(task.done() for task in held)
            served = len(fake.requests)

            status, committed = await _json(
                session, "POST", f"{proxy.url}/v1/weights/commit", json={"version": "2"}
            )
            assert status == 200
            assert (committed["weight_version"], committed["epoch"]) == ("2", 1)
            assert committed["held_seconds"] > 0
            answers = await asyncio.gather(*held)

        assert served == 2, "no held call reached the engine during the update"
        assert all(a.choices[0].message.content == "a slow answer" for a in answers)
        await before[1]
        calls = sorted(await store.calls(created.id), key=lambda c: c.received_at)
        assert [c.status for c in calls] == [CallStatus.OK] * 5
        # Sent before the update: sampled on the old weights; held by it: on the new ones.
        assert [c.weight_version for c in calls] == ["1", "1", "2", "2", "2"]


async def test_commit_loads_weights_into_every_engine_with_the_version(
    store: Store, sdk: OpenAIFactory
) -> None:
    first, second = FakeVLLM(), FakeVLLM()
    async with (
        fake_engine(first) as a,
        fake_engine(second) as b,
        running_proxy(store, a.url, b.url, weight_version="0") as proxy,
    ):
        async with aiohttp.ClientSession() as session:
            await _json(session, "POST", f"{proxy.url}/v1/weights/begin", json={})
            status, committed = await _json(
                session,
                "POST",
                f"{proxy.url}/v1/weights/commit",
                json={"version": 7, "model_path": "/ckpt/step-7"},
            )

        assert status == 200
        assert committed["weight_version"] == "7"
        assert all(r["ok"] for r in committed["backends"])
        for url in (a.url, b.url):
            # Each engine's steps in order: load under the version, read it back, read its
            # weights' checksums, resume.
            steps = [
                r["detail"].split(":")[0] for r in committed["backends"] if r["backend"] == url
            ]
            assert steps == [
                "POST /update_weights_from_disk",
                "GET /weight_info",
                "POST /weight_checker",
                "POST /resume",
            ]
        for fake in (first, second):
            assert fake.weight_updates == [
                {
                    "model_path": "/ckpt/step-7",
                    "load_format": "auto",
                    "weight_version": "7",
                    "abort_all_requests": False,
                    "flush_cache": True,
                }
            ]
        created = await store.create_rollout()
        client = sdk(f"{proxy.url}/r/{created.key}/v1")
        await client.chat.completions.create(model="m", messages=MESSAGES)
        assert [c.weight_version for c in await store.calls(created.id)] == ["7"]


async def test_a_failed_load_keeps_calls_held_until_cancel_resumes_the_old_version(
    store: Store, sdk: OpenAIFactory
) -> None:
    fake = FakeVLLM(refuse_weights="shape mismatch in layer 3")
    async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
        created = await store.create_rollout()
        client = sdk(f"{proxy.url}/r/{created.key}/v1", max_retries=0)
        async with aiohttp.ClientSession() as session:
            await _json(session, "POST", f"{proxy.url}/v1/weights/begin", json={})
            await _json(session, "POST", f"{proxy.url}/v1/weights/commit", json={"version": "1"})
            await _json(session, "POST", f"{proxy.url}/v1/weights/begin", json={})
            held = asyncio.create_task(client.chat.completions.create(model="m", messages=MESSAGES))
            status, failed = await _json(
                session,
                "POST",
                f"{proxy.url}/v1/weights/commit",
                json={"version": "2", "model_path": "/ckpt/2"},
            )
            assert status == 502
            assert failed["error"]["code"] == "weight_load_failed"
            assert "shape mismatch in layer 3" in failed["backends"][0]["detail"]
            await asyncio.sleep(0.2)
            assert not held.done()
            assert proxy.ctx.hold.waiting == 1

            status, cancelled = await _json(session, "POST", f"{proxy.url}/v1/weights/cancel")
            assert (status, cancelled["weight_version"], cancelled["paused"]) == (200, "1", False)
            await held

        assert [c.weight_version for c in await store.calls(created.id)] == ["1"]


async def test_misuse_gets_one_clear_error(store: Store) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        async with aiohttp.ClientSession() as session:
            url = f"{proxy.url}/v1/weights"
            status, error = await _json(session, "POST", f"{url}/commit", json={"version": "1"})
            assert (status, error["error"]["code"]) == (409, "no_update")
            status, error = await _json(session, "POST", f"{url}/begin", json={"mode": "now"})
            assert (status, error["error"]["param"]) == (400, "mode")
            status, _ = await _json(session, "POST", f"{url}/begin", json={"timeout": 1})
            assert status == 200
            status, error = await _json(session, "POST", f"{url}/begin", json={})
            assert (status, error["error"]["code"]) == (409, "update_in_progress")
            status, error = await _json(session, "POST", f"{url}/commit", json={"version": ""})
            assert (status, error["error"]["param"]) == (400, "version")
            status, error = await _json(session, "POST", f"{url}/commit", data=b"{not json")
            assert status == 400
            status, _ = await _json(session, "POST", f"{url}/cancel")
            assert status == 200


async def test_versions_are_ordered_by_commit_and_the_routes_need_the_admin_token(
    store: Store,
) -> None:
    async with (
        fake_engine() as engine,
        running_proxy(store, engine.url, weight_version="base", admin_token="adm") as proxy,
    ):
        async with aiohttp.ClientSession() as session:
            url = f"{proxy.url}/v1/weights"
            status, _ = await _json(session, "GET", url)
            assert status == 401
            status, _ = await _json(session, "POST", f"{url}/begin", json={})
            assert status == 401
            assert not proxy.ctx.hold.paused
            auth = {"Authorization": "Bearer adm"}
            for version in ("10", "9"):
                await _json(session, "POST", f"{url}/begin", json={}, headers=auth)
                await _json(
                    session, "POST", f"{url}/commit", json={"version": version}, headers=auth
                )
            status, shown = await _json(session, "GET", url, headers=auth)

        assert status == 200
        assert shown["history"] == [
            {"version": "base", "epoch": 0},
            {"version": "10", "epoch": 1},
            {"version": "9", "epoch": 2},
        ]
        hold = proxy.ctx.hold
        assert hold.epoch_of("9") - hold.epoch_of("10") == 1
        assert hold.epoch_of("never-committed") == 0


async def test_an_update_left_open_past_its_lease_is_cancelled(
    store: Store, sdk: OpenAIFactory
) -> None:
    async with (
        fake_engine() as engine,
        running_proxy(store, engine.url, weight_version="1") as proxy,
    ):
        created = await store.create_rollout()
        client = sdk(f"{proxy.url}/r/{created.key}/v1", max_retries=0)
        async with aiohttp.ClientSession() as session:
            status, _ = await _json(
                session, "POST", f"{proxy.url}/v1/weights/begin", json={"lease": 0.5}
            )
            assert status == 200
            held = asyncio.create_task(client.chat.completions.create(model="m", messages=MESSAGES))
            await until(lambda: proxy.ctx.hold.waiting == 1)
            # The trainer never comes back: the lease runs out and the call goes on.
            await held
            status, error = await _json(
                session, "POST", f"{proxy.url}/v1/weights/commit", json={"version": "2"}
            )

    assert (status, error["error"]["code"]) == (409, "no_update")
    assert [c.weight_version for c in await store.calls(created.id)] == ["1"]
