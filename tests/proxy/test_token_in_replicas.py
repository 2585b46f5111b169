"""A token-in conversation continues on whichever proxy process its next call reaches: each
answered call's lineage fingerprints are stored beside it, so a replica, a worker or a
restarted proxy that never saw the conversation bridges it from the store (SQLite and
PostgreSQL alike)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from rolltap.analysis.reading import rollout_trajectories
from tests.support.databases import PostgresServer
from tests.support.proxy import fake_engine, new_rollout, running_proxy
from tests.support.stores import opened_store


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The database both proxies record into."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.sqlite'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    name = server.fresh()
    try:
        yield server.url(name)
    finally:
        server.drop(name)


async def test_a_conversation_bridges_across_proxy_processes(shared: str) -> None:
    async with opened_store(shared) as store, opened_store(shared) as other:
        async with (
            fake_engine() as engine,
            running_proxy(store, engine.url) as first,
            running_proxy(other, engine.url) as second,
            aiohttp.ClientSession() as http,
        ):
            rollout_id, key = await new_rollout(store, task_id="t", meta={"token_in": True})
            messages: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
            # The second turn reaches a process that never saw the first; the third goes back
            # to the first process, which never saw the second.
            for turn, proxy in enumerate((first, second, first)):
                url = f"{proxy.url}/r/{key}/v1/chat/completions"
                body = {"model": "fake-model", "messages": messages}
                async with http.post(url, json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    (choice,) = (await resp.json())["choices"]
                messages += [choice["message"], {"role": "user", "content": f"more {turn}"}]
        calls = await store.calls(rollout_id)
        assert [c.bridge for c in calls] == ["first_turn", "bridged", "bridged"]
        for before, after in itertools.pairwise(calls):
            b, a = await store.call_tokens(before.id), await store.call_tokens(after.id)
            held = np.concatenate([b.prompt_ids, b.choices[0].token_ids])
            assert np.array_equal(a.prompt_ids[: len(held)], held)
        (one,) = (await rollout_trajectories(store, rollout_id)).trajectories
        assert one.call_ids == tuple(c.id for c in calls)
