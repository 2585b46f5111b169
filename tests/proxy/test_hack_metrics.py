"""/metrics counts the rollouts the reward-hack detectors flagged, per detector."""

from __future__ import annotations

import aiohttp

from rolltap.analysis.hacks import HackFlag
from rolltap.store import Store
from rolltap.store.events import Declared
from tests.support.proxy import new_rollout, running_proxy


async def test_flagged_rollouts_are_counted_per_detector(store: Store) -> None:
    git = HackFlag("git_history", "reads the reflog", command="git reflog")
    async with running_proxy(store) as proxy:
        first, _ = await new_rollout(store)
        second, _ = await new_rollout(store)
        clean, _ = await new_rollout(store)
        await store.report(first, Declared("finished"), hack_flags=[git, git])
        await store.report(
            second, Declared("timed_out"), hack_flags=[git, HackFlag("idle_clock", "ran out")]
        )
        await store.report(clean, Declared("finished"), hack_flags=[])
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{proxy.url}/metrics") as resp:
                text = await resp.text()

    assert 'rolltap_hack_flagged_rollouts_total{detector="git_history"} 2.0' in text
    assert 'rolltap_hack_flagged_rollouts_total{detector="idle_clock"} 1.0' in text
