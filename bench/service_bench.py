"""Rollout-service benchmark: how fast groups reach a trainer, and how long a weight update holds.

    python bench/service_bench.py [--rollouts 1000] [--turns 20] [--samples 8] [--skip ...]

groups: a store of finished rollouts (export_bench's: 20 turns each, a 600-token system prompt,
120 tokens of tool output and an 80-token answer with logprobs per turn), grouped by task,
`--samples` per group. A batch naming them is submitted to the real service (over HTTP, on
loopback); every rollout is already finished, so the service only judges and delivers. Reported,
for the base64 and the Arrow encodings side by side:

* judging: the batch from POST to its last group judged (trajectory assembly per group);
* delivery: every group over GET /v1/batches/{id}/groups (pages of 25) and over the SSE stream
  through `rolltap.client`, in groups/s and tokens/s, decoding included;
* per group, in this process: assembly from the store, packing (rows), serializing, decoding,
  and the bytes on the wire.

hold: the proxy in front of a fake engine whose answers take `--answer-ms`, with `--clients`
harnesses calling it without pause, and `--updates` updates in a row of each kind: pause/resume
alone (/admin/pause?wait, /admin/resume), a drain update (/v1/weights begin + commit), a drain
update that also loads weights into the engine (commit with model_path), and an abort_resume
update (answers cut and continued token-in). Reported: how long dispatch was held (from the
first request to the answer of the last), p50 and max, and the worst latency of a harness call
caught by it; every harness call must succeed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the fake engine of the test suite
sys.path.insert(0, str(ROOT / "bench"))

from export_bench import build_store  # noqa: E402

from rolltap import wire  # noqa: E402
from rolltap.analysis.reading import build_trajectories  # noqa: E402
from rolltap.client import AsyncClient, Group, parse_group  # noqa: E402
from rolltap.proxy.context import ProxySettings  # noqa: E402
from rolltap.proxy.middleware import errors  # noqa: E402
from rolltap.proxy.server import start_proxy  # noqa: E402
from rolltap.runner.plan import Planned  # noqa: E402
from rolltap.runner.rollout import RolloutResult  # noqa: E402
from rolltap.runner.service import Service, ServiceLimits, mount  # noqa: E402
from rolltap.runner.service.clock import VersionClock  # noqa: E402
from rolltap.runner.service.executor import RolloutExecutor  # noqa: E402
from rolltap.runner.service.groups import GroupRecord, pack_group, trajectory_row  # noqa: E402
from rolltap.runner.service.spec import BatchSpec, fingerprint, parse_spec  # noqa: E402
from rolltap.store import Store  # noqa: E402
from tests.support.fake_vllm import FakeVLLM, Reply  # noqa: E402
from tests.support.proxy import fake_engine  # noqa: E402

BATCH = "bench-groups"


# -- groups -------------------------------------------------------------------------------------


def _body(tasks: int, samples: int) -> dict[str, Any]:
    return {
        "id": BATCH,
        "tasks": [{"id": f"t{i}", "instruction": "x", "test": "true"} for i in range(tasks)],
        "harness": "single-call",
        "sandbox": "local",
        "samples_per_task": samples,
    }


class _Finished:
    """Every rollout of the batch is already finished: nothing is ever run."""

    async def run(self, planned: Planned) -> RolloutResult:
        raise AssertionError(f"{planned.rollout_id} should not run")


@contextlib.asynccontextmanager
async def _executors(spec: BatchSpec, batch_id: str) -> AsyncIterator[RolloutExecutor]:
    yield _Finished()


class _Clock:
    async def read(self) -> VersionClock:
        return VersionClock(0, {}, None)


async def bench_groups(url: str, rollouts: int, samples: int) -> None:
    store = await Store.connect(url)
    limits = ServiceLimits(sandboxes=("local",), default_sandbox="local")

    async def model() -> str:
        return "bench-model"

    service = Service(
        store, _Clock(), _executors, harnesses=["single-call"], model=model, limits=limits
    )
    app = web.Application(middlewares=[errors], client_max_size=256 << 20)
    mount(app, service)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    groups = rollouts // samples
    try:
        async with aiohttp.ClientSession() as session:
            start = time.perf_counter()
            async with session.post(f"{base}/v1/batches", json=_body(groups, samples)) as resp:
                assert resp.status == 201, await resp.text()
            batch = service.get(BATCH)
            assert batch.runner is not None
            await batch.runner
            judged = time.perf_counter() - start
            print(
                f"judging: {groups} groups of {samples} in {judged:.2f} s "
                f"({groups / judged:,.1f} groups/s, assembly of every trajectory included)"
            )
            for encoding in wire.ENCODINGS:
                await _delivery(session, base, encoding, groups)
        await _per_group(store, service, samples)
    finally:
        await runner.cleanup()
        await store.close()


async def _delivery(session: aiohttp.ClientSession, base: str, encoding: str, groups: int) -> None:
    start = time.perf_counter()
    seen = size = tokens = 0
    after = 0
    decode = 0.0
    while True:
        url = f"{base}/v1/batches/{BATCH}/groups?format={encoding}&limit=25&after={after}"
        async with session.get(url) as resp:
            raw = await resp.read()
        size += len(raw)
        page = orjson.loads(raw)
        if not page["groups"]:
            break
        t0 = time.perf_counter()
        parsed = [parse_group(g) for g in page["groups"]]
        decode += time.perf_counter() - t0
        tokens += sum(
            len(t.prompt_ids) + len(t.response_ids) for g in parsed for t in g.trajectories
        )
        seen += len(parsed)
        after = page["last_seq"]
    took = time.perf_counter() - start
    assert seen == groups, (seen, groups)
    print(
        f"GET /groups {encoding:>6}: {seen / took:,.1f} groups/s, {tokens / took / 1e6:.2f} M "
        f"tokens/s, {size / 2**20:.1f} MiB ({took:.2f} s, client decode {decode:.2f} s)"
    )
    client = AsyncClient(base, encoding=encoding)
    start = time.perf_counter()
    received = [g async for g in client.groups(BATCH)]
    took = time.perf_counter() - start
    await client.close()
    assert len(received) == groups
    assert all(isinstance(g, Group) for g in received)
    print(
        f"SSE events  {encoding:>6}: {groups / took:,.1f} groups/s, "
        f"{tokens / took / 1e6:.2f} M tokens/s ({took:.2f} s, decoding included)"
    )


async def _per_group(store: Store, service: Service, samples: int) -> None:
    batch = service.get(BATCH)
    records: list[GroupRecord] = batch.kept
    n = min(20, len(records))
    costs: dict[str, list[float]] = {}

    def clock(name: str, started: float) -> float:
        now = time.perf_counter()
        costs.setdefault(name, []).append(now - started)
        return now

    sizes: dict[str, int] = {}
    for record in records[:n]:
        t = time.perf_counter()
        views = await store.rollouts(ids=list(record.rollout_ids))
        built = await build_trajectories(store, views)
        t = clock("assembly (store -> trajectories)", t)
        rows = [trajectory_row(x) for b in built for x in b.trajectories]
        t = clock("rows", t)
        for encoding in wire.ENCODINGS:
            message = pack_group(BATCH, batch.spec, record, built, encoding)
            t = clock(f"pack {encoding}", t)
            data = orjson.dumps(message)
            t = clock(f"serialize {encoding}", t)
            parse_group(orjson.loads(data))
            t = clock(f"decode {encoding}", t)
            sizes[encoding] = len(data)
        del rows
    print(f"per group of {samples} (mean of {n}):")
    for name, values in costs.items():
        print(f"  {name:<34} {statistics.mean(values) * 1e3:8.2f} ms")
    for encoding, size in sizes.items():
        print(f"  bytes on the wire, {encoding:<15} {size / 2**10:8.1f} KiB")
    arrow = sizes["arrow"] * 3 / 4  # its IPC stream travels base64-encoded inside JSON
    print(f"  (the Arrow IPC stream itself: {arrow / 2**10:.1f} KiB)")


# -- hold -----------------------------------------------------------------------------------------


async def bench_hold(url: str, clients: int, updates: int, answer_ms: float) -> None:
    store = await Store.connect(url)
    tokens = 20
    fake = FakeVLLM(
        script=lambda body: Reply(text="x" * (tokens - 1)), token_delay=answer_ms / 1e3 / tokens
    )
    fake.record_requests = False
    async with fake_engine(fake) as engine:
        settings = ProxySettings(backends=[engine.url], port=0, weight_version="0")
        proxy = await start_proxy(settings, store)
        try:
            await _hold_modes(proxy.url, store, clients, updates, answer_ms)
        finally:
            await proxy.stop()
    await store.close()


async def _hold_modes(
    base: str, store: Store, clients: int, updates: int, answer_ms: float
) -> None:
    latencies: list[tuple[float, float]] = []
    stop = asyncio.Event()
    keys = [(await store.create_rollout()).key for _ in range(clients)]
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})

    async def harness(session: aiohttp.ClientSession, key: str) -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            async with session.post(
                f"{base}/r/{key}/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            latencies.append((t0, time.perf_counter()))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        load = [asyncio.ensure_future(harness(session, k)) for k in keys]
        await asyncio.sleep(1.0)
        version = 0

        async def pause_resume() -> None:
            nonlocal version
            version += 1
            await _post(session, f"{base}/admin/pause?wait=60")
            await _post(session, f"{base}/admin/resume", {"weight_version": str(version)})

        async def update(mode: str, model_path: str | None) -> None:
            nonlocal version
            version += 1
            await _post(session, f"{base}/v1/weights/begin", {"mode": mode})
            commit: dict[str, Any] = {"version": str(version)}
            if model_path:
                commit["model_path"] = model_path
            await _post(session, f"{base}/v1/weights/commit", commit)

        modes = {
            "pause/resume alone": pause_resume,
            "drain update": lambda: update("drain", None),
            "drain update + load": lambda: update("drain", "/ckpt/bench"),
            "abort_resume update": lambda: update("abort_resume", None),
        }
        print(
            f"hold: {clients} harnesses calling an engine of ~{answer_ms:.0f} ms answers, "
            f"{updates} updates of each kind"
        )
        for name, run_update in modes.items():
            holds: list[float] = []
            caught: list[float] = []
            for _ in range(updates):
                await asyncio.sleep(0.2)
                latencies.clear()
                t0 = time.perf_counter()
                await run_update()
                t1 = time.perf_counter()
                holds.append(t1 - t0)
                await asyncio.sleep(0.3)
                caught += [b - a for a, b in latencies if a < t1 and b > t0]
            print(
                f"  {name:<22} held p50 {statistics.median(holds) * 1e3:7.1f} ms, max "
                f"{max(holds) * 1e3:7.1f} ms; worst call caught by it "
                f"{max(caught, default=0) * 1e3:7.1f} ms"
            )
        stop.set()
        await asyncio.gather(*load)  # a harness call that failed raised there


async def _post(session: aiohttp.ClientSession, url: str, body: Any = None) -> Any:
    async with session.post(url, json=body if body is not None else {}) as resp:
        data = await resp.json()
        assert resp.status == 200, data
        return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--answer-ms", type=float, default=200.0, help="the fake engine's answers")
    parser.add_argument("--skip", nargs="*", default=[], choices=["groups", "hold"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if "groups" not in args.skip:
            url = f"sqlite:///{Path(tmp) / 'groups.sqlite'}"
            groups = args.rollouts // args.samples
            spec = parse_spec(_body(groups, args.samples), ServiceLimits(sandboxes=("local",)))
            meta = {"service": {"fingerprint": fingerprint(_body(groups, args.samples))}}
            assert spec.fingerprint == meta["service"]["fingerprint"]
            built = asyncio.run(
                build_store(
                    url,
                    groups * args.samples,
                    args.turns,
                    0.1,
                    samples=args.samples,
                    batch=BATCH,
                    meta=meta,
                )
            )
            print(f"store: {groups * args.samples} rollouts x {args.turns} turns in {built:.1f} s")
            asyncio.run(bench_groups(url, groups * args.samples, args.samples))
        if "hold" not in args.skip:
            asyncio.run(
                bench_hold(
                    f"sqlite:///{Path(tmp) / 'hold.sqlite'}",
                    args.clients,
                    args.updates,
                    args.answer_ms,
                )
            )


if __name__ == "__main__":
    main()
