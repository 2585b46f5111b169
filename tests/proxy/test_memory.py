"""The proxy's memory stays bounded: finished and idle rollouts leave its caches, and heavy
reads run off its event loop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType

import aiohttp
import orjson
import pytest

from rolltap.analysis import trajectory
from rolltap.proxy.context import ProxyContext
from rolltap.store import NewRollout, Store
from rolltap.store.events import Declared
from tests.support.proxy import fake_engine, new_rollout, running_proxy
from tests.support.records import call

MESSAGES = [{"role": "user", "content": "hello"}]


async def _chat(session: aiohttp.ClientSession, base: str, key: str) -> int:
    body = {"model": "m", "messages": MESSAGES}
    async with session.post(f"{base}/r/{key}/v1/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status


async def _responses(session: aiohttp.ClientSession, base: str, key: str) -> int:
    body = {"model": "m", "input": "hello"}
    async with session.post(f"{base}/r/{key}/v1/responses", json=body) as resp:
        await resp.read()
        return resp.status


def _cached(ctx: ProxyContext) -> tuple[int, int, int]:
    return len(ctx.rollouts), len(ctx.router), len(ctx.recall)


async def test_finished_rollouts_leave_the_proxys_caches(store: Store) -> None:
    n = 40
    async with (
        fake_engine() as engine,
        running_proxy(store, engine.url) as proxy,
        aiohttp.ClientSession() as session,
    ):
        rollouts = [await new_rollout(store) for _ in range(n)]
        for _, key in rollouts:
            assert await _chat(session, proxy.url, key) == 200
            assert await _responses(session, proxy.url, key) == 200
        assert _cached(proxy.ctx) == (n, n, n)

        # Half finish through the admin API, half as the runner does, through the store.
        for i, (rollout_id, _) in enumerate(rollouts):
            if i % 2:
                await store.report(rollout_id, Declared("failed"))
                continue
            async with session.patch(
                f"{proxy.url}/admin/rollouts/{rollout_id}", json={"status": "finished"}
            ) as resp:
                assert resp.status == 200
        assert _cached(proxy.ctx) == (0, 0, 0)

        # A finished rollout's key is refused without coming back into the caches.
        assert await _chat(session, proxy.url, rollouts[0][1]) == 403
        assert _cached(proxy.ctx) == (0, 0, 0)


async def test_idle_rollouts_leave_the_caches_and_come_back_on_their_next_call(
    store: Store,
) -> None:
    async with (
        fake_engine() as engine,
        running_proxy(store, engine.url, idle_rollout_seconds=0.2) as proxy,
        aiohttp.ClientSession() as session,
    ):
        rollouts = [await new_rollout(store, max_calls=2) for _ in range(10)]
        for _, key in rollouts:
            assert await _chat(session, proxy.url, key) == 200
        for _ in range(100):
            if _cached(proxy.ctx) == (0, 0, 0):
                break
            await asyncio.sleep(0.05)
        assert _cached(proxy.ctx) == (0, 0, 0)

        # Read back from the store, budget included: one call left each.
        key = rollouts[0][1]
        assert [await _chat(session, proxy.url, key) for _ in range(2)] == [200, 403]


@dataclass
class Seen:
    """Where assembly code was found running: samples on the loop's thread and on others."""

    on_loop: int = 0
    elsewhere: int = 0


@contextlib.contextmanager
def assembly_sampler(period: float = 0.001) -> Iterator[Seen]:
    """Look at every thread's stack each `period` seconds from a thread of our own and count
    where analysis/trajectory.py's code is running. Unlike timing the loop, this does not depend
    on how fast the machine is: assembly seen on the loop's thread is the fault itself."""
    seen = Seen()
    loop_thread = threading.get_ident()
    code_file = trajectory.__file__
    stop = threading.Event()

    def runs_assembly(frame: FrameType | None) -> bool:
        while frame is not None:
            if frame.f_code.co_filename == code_file:
                return True
            frame = frame.f_back
        return False

    def sample() -> None:
        while not stop.wait(period):
            for ident, frame in sys._current_frames().items():
                if ident != threading.get_ident() and runs_assembly(frame):
                    if ident == loop_thread:
                        seen.on_loop += 1
                    else:
                        seen.elsewhere += 1

    sampler = threading.Thread(target=sample, name="assembly-sampler", daemon=True)
    sampler.start()
    try:
        yield seen
    finally:
        stop.set()
        sampler.join()


async def _long_rollout(store: Store, calls: int) -> str:
    """An agent's rollout of many turns, each prompt the last one plus its answer and more."""
    created = await store.create_rollout(NewRollout())
    prompt = list(range(3, 1003))
    pending = []
    for i in range(calls):
        answer = [7 + i % 50] * 40
        pending.append(store.append_call(call(created.id, prompt, answer)))
        prompt = [*prompt, *answer, 5, 6, 7 + i % 90]
        if len(prompt) > 20_000:  # a compaction: a new segment starts
            prompt = [*range(3, 1003), i]
    await asyncio.gather(*pending)
    return created.id


@pytest.fixture
def tuned_like_serve() -> Iterator[None]:
    """The interpreter tuned as `rolltap serve` runs it (proxy/server.py::_tune_gc): a full
    collection holds the GIL whichever thread triggers it, and at the default 5 ms switch
    interval every wake-up of the loop can wait that long for a busy thread to hand it over."""
    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    sys.setswitchinterval(0.0005)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)
        gc.unfreeze()


@pytest.mark.usefixtures("tuned_like_serve")
async def test_a_big_trajectory_read_does_not_stall_the_proxys_loop(store: Store) -> None:
    rollout_id = await _long_rollout(store, 4000)
    view = await store.rollout(rollout_id)

    # Reference: the same assembly run on this loop, as the admin API used to. It shows the
    # sampler sees assembly where it runs.
    with assembly_sampler() as on_loop:
        await trajectory.build(store.db, [view])
    assert on_loop.on_loop > 0

    async with (
        fake_engine() as engine,
        running_proxy(store, engine.url) as proxy,
        aiohttp.ClientSession() as session,
    ):
        _, key = await new_rollout(store)
        with assembly_sampler() as through_proxy:
            read = asyncio.create_task(
                session.get(f"{proxy.url}/admin/rollouts/{rollout_id}/trajectory")
            )
            # Calls keep being served while the trajectory is assembled.
            while not read.done():
                assert await _chat(session, proxy.url, key) == 200
            async with await read as resp:
                assert resp.status == 200
                raw = await resp.read()

    assert orjson.loads(raw)["rollout"]["id"] == rollout_id
    # The proxy (in this process, on this loop) assembled it on another thread, never here.
    assert through_proxy.on_loop == 0
    assert through_proxy.elsewhere > 0
