"""What a derived seed and a per-version cache salt cost per call (expected: nothing measurable).

    python bench/sampling_bench.py [--calls 400] [--rounds 5] [--micro 200000]

micro: the per-call work alone, in this process: the seed derivation (BLAKE2b of six fields),
imposing the batch's options on the request, and the salt string, in microseconds per call.

proxy: the real proxy in front of a fake vLLM-speaking engine (both in this process, on
loopback), `--calls` sequential chat calls of one rollout per run; runs alternate between a
rollout whose batch imposes `temperature` only (no seed: nothing derived) with calls salted,
a rollout whose batch imposes a `seed` (derived per call) with calls salted, and salting off
(`serve --no-cache-salt`), `--rounds` times. Reported per variant: this process's CPU per call
(proxy + engine + client: the difference between variants is the figure) and the p50 latency.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rolltap.proxy.context import ProxySettings
from rolltap.proxy.server import start_proxy
from rolltap.proxy.upstream.sampling import Sampling, SeedSource, cache_salt, impose
from rolltap.store import NewRollout, Store
from tests.support.fake_vllm import FakeVLLM

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def micro(n: int) -> tuple[float, float]:
    """µs per call: with a derived seed and a salt, and imposing fixed options alone."""
    seeded = Sampling({"temperature": 1.0}, SeedSource(1234, "task-0001", 3, 0))
    fixed = Sampling({"temperature": 1.0})
    place = iter(range(10**9))

    def with_seed() -> None:
        body = impose(BODY, seeded.for_call(next(place)))
        body["cache_salt"] = cache_salt("17", body.get("cache_salt"))

    def without() -> None:
        impose(BODY, fixed.for_call(0))

    return (
        timeit.timeit(with_seed, number=n) / n * 1e6,
        timeit.timeit(without, number=n) / n * 1e6,
    )


async def one_run(
    store: Store, engine_url: str, meta: dict[str, object], salted: bool, calls: int
) -> tuple[float, float]:
    proxy = await start_proxy(
        ProxySettings(backends=[engine_url], port=0, weight_version="1", cache_salt=salted), store
    )
    try:
        created = await store.create_rollout(NewRollout(task_id="t", sample_index=0, meta=meta))
        url = f"{proxy.url}/r/{created.key}/v1/chat/completions"
        latencies: list[float] = []
        async with aiohttp.ClientSession() as session:
            for _ in range(5):  # warm-up
                async with session.post(url, json=BODY) as resp:
                    await resp.read()
            cpu = time.process_time()
            for _ in range(calls):
                began = time.perf_counter()
                async with session.post(url, json=BODY) as resp:
                    await resp.read()
                    assert resp.status == 200
                latencies.append(time.perf_counter() - began)
            cpu = time.process_time() - cpu
    finally:
        await proxy.stop()
    return cpu / calls * 1e3, statistics.median(latencies) * 1e3


async def proxy_runs(calls: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    variants: dict[str, tuple[dict[str, object], bool]] = {
        "no seed, salted": ({"sampling": {"temperature": 1.0}}, True),
        "derived seed, salted": ({"sampling": {"temperature": 1.0, "seed": 1234}}, True),
        "no seed, no salt": ({"sampling": {"temperature": 1.0}}, False),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    fake = FakeVLLM(record_requests=False)
    server = TestServer(fake.app())
    await server.start_server()
    with tempfile.TemporaryDirectory() as tmp:
        store = await Store.connect(f"sqlite:///{tmp}/bench.sqlite")
        try:
            engine_url = str(server.make_url("")).rstrip("/")
            for _ in range(rounds):
                for name, (meta, salted) in variants.items():
                    results[name].append(await one_run(store, engine_url, meta, salted, calls))
        finally:
            await store.close()
            await server.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--micro", type=int, default=200_000)
    args = parser.parse_args()

    seeded, fixed = micro(args.micro)
    print(f"micro ({args.micro} calls): seed derivation + impose + salt {seeded:.2f} µs/call")
    print(f"  impose alone {fixed:.2f} µs/call; the seed and salt add {seeded - fixed:.2f} µs")
    results = asyncio.run(proxy_runs(args.calls, args.rounds))
    print(f"proxy, {args.calls} sequential calls x {args.rounds} rounds (median of rounds):")
    for name, runs in results.items():
        cpu = statistics.median(r[0] for r in runs)
        p50 = statistics.median(r[1] for r in runs)
        print(f"  {name:22s} CPU {cpu:.3f} ms/call   p50 {p50:.3f} ms")


if __name__ == "__main__":
    main()
