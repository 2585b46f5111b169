"""A rollout's bound on staleness (proxy/staleness.py), counted in commits: with
max_staleness 1,
a call one update behind the rollout's first goes on, one two updates behind is refused in the
client's own dialect before any engine sees it, and the rollout ends, saying why."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from rolltap.store import CallStatus, RolloutStatus, Store
from tests.support.proxy import fake_engine, new_rollout, running_proxy

MESSAGES = [{"role": "user", "content": "hello"}]
DIALECTS = {
    "chat": ("/v1/chat/completions", {"model": "m", "messages": MESSAGES}),
    "responses": ("/v1/responses", {"model": "m", "input": "hello"}),
    "messages": ("/v1/messages", {"model": "m", "max_tokens": 16, "messages": MESSAGES}),
}


async def _post(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with session.post(url, json=body) as resp:
        return resp.status, orjson.loads(await resp.read())


async def _commit(session: aiohttp.ClientSession, proxy_url: str, version: str) -> None:
    status, _ = await _post(session, f"{proxy_url}/v1/weights/begin", {"mode": "abort_resume"})
    assert status == 200
    status, _ = await _post(session, f"{proxy_url}/v1/weights/commit", {"version": version})
    assert status == 200


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
async def test_a_call_past_the_bound_is_refused_in_its_dialect_and_ends_the_rollout(
    store: Store, dialect: str
) -> None:
    path, body = DIALECTS[dialect]
    bound = {"max_staleness": 1, "stale": "drop"}
    async with (
        fake_engine() as engine,
        running_proxy(store, engine.url, weight_version="1") as proxy,
    ):
        rollout_id, key = await new_rollout(store, meta={"staleness": bound})
        url = f"{proxy.url}/r/{key}{path}"
        async with aiohttp.ClientSession() as session:
            assert (await _post(session, url, body))[0] == 200
            await _commit(session, proxy.url, "2")
            # Read afresh from the store (as a restarted replica would): it still knows the
            # version of the rollout's first call.
            proxy.ctx.release(rollout_id)
            assert len(proxy.ctx.rollouts) == 0
            assert (await _post(session, url, body))[0] == 200, "one update behind: allowed"
            await _commit(session, proxy.url, "3")
            status, refused = await _post(session, url, body)
            later, _ = await _post(session, url, body)

    assert status == 403
    if dialect == "messages":
        assert refused["type"] == "error"
        assert refused["error"]["type"] == "permission_error"
    else:
        assert refused["error"]["type"] == "permission_error"
        assert refused["error"]["code"] == "rollout_stale"
    assert "is stale" in refused["error"]["message"]
    assert later == 403, "the rollout has ended"
    assert len(engine.fake.requests) == 2
    calls = sorted(await store.calls(rollout_id), key=lambda c: c.seq)
    assert [c.status for c in calls] == [CallStatus.OK] * 2 + [CallStatus.REJECTED] * 2
    assert [c.weight_version for c in calls[:2]] == ["1", "2"]
    view = await store.rollout(rollout_id)
    assert view.status is RolloutStatus.CANCELLED
    assert view.meta["stale"] == {
        "action": "drop",
        "gap": 2,
        "max_staleness": 1,
        "oldest_version": "1",
        "version": "3",
    }


async def test_without_a_bound_nothing_is_refused(store: Store) -> None:
    path, body = DIALECTS["chat"]
    async with (
        fake_engine() as engine,
        running_proxy(store, engine.url, weight_version="1") as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        async with aiohttp.ClientSession() as session:
            for version in ("2", "3", "4"):
                assert (await _post(session, f"{proxy.url}/r/{key}{path}", body))[0] == 200
                await _commit(session, proxy.url, version)

    assert "stale" not in (await store.rollout(rollout_id)).meta
