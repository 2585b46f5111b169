"""Scale benchmark: proxy workers beside a bare forwarder and LiteLLM, Ray nodes, PostgreSQL.

    python bench/scale_bench.py [--duration 8] [--concurrency 64]
                                [--litellm /path/to/venv/bin/litellm] [--ray-rollouts 48]
                                [--skip proxy latency ray postgres]

One run prints side by side:

- capture throughput (the fake engine answers at once, so each proxy's own ceiling shows),
  non-streaming and streaming calls/s at `--concurrency` clients, with each proxy's CPU per
  call (non-streaming / streaming: 200 chunks) and rolltap's as a ratio of the forwarder's:
  the engine direct, the bare capturing forwarder (bench/reference_forwarder.py --capture:
  token ids and logprobs asked for and stripped, no store), `rolltap serve --workers 1` and
  `--workers 2` (capture into SQLite), and LiteLLM's proxy (`--litellm`: its `litellm`
  executable, installed in a venv of its own);
- added latency at one client: each proxy's p50 minus the engine's, and rolltap's as a ratio of
  the forwarder's;
- rollouts per minute of a trivial single-call task through `run_batch_on_ray` on a local Ray
  cluster of 1, 2 and 3 nodes (`sandbox` cap 4 each, bwrap, a fake engine), PostgreSQL store;
- the PostgreSQL append rate (calls/s, calls per commit) at the concurrency one proxy replica
  offers its writer, which sets the batch size of its group commits.

Every process shares this machine's cores: on a 2-core machine the engine, the load generator
and the proxy workers compete, so `--workers 2` shows what a second process costs and gives
there, not what it gives on a machine with cores to spare; the proxy's CPU per call (printed)
is the figure that carries over.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import proxy_bench as pb  # noqa: E402
import store_bench  # noqa: E402

PG_ADMIN = os.environ.get("ROLLTAP_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextlib.contextmanager
def engine(token_delay_ms: float) -> Iterator[str]:
    port = pb.free_port()
    cmd = [sys.executable, "-m", "tests.support.fake_vllm", "--port", str(port)]
    cmd += ["--reply-tokens", str(pb.ANSWER_TOKENS), "--token-delay-ms", str(token_delay_ms)]
    with pb.process(cmd, f"http://127.0.0.1:{port}"):
        yield f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def rolltap(
    upstream: str, workers: int, tmp: str, *, journal: bool = False
) -> Iterator[tuple[str, int]]:
    """`rolltap serve` capturing into a fresh SQLite file under `tmp` (`journal`: its calls'
    records into a plain file instead, bench/journal_serve.py)."""
    port = pb.free_port()
    program = [str(ROOT / "bench" / "journal_serve.py")] if journal else ["-m", "rolltap.cli.main"]
    cmd = [sys.executable, *program, "serve", "--backend", upstream]
    cmd += ["--db", f"sqlite:///{tmp}/w{workers}-{port}.sqlite", "--port", str(port)]
    cmd += ["--workers", str(workers)]
    with pb.process(cmd, f"http://127.0.0.1:{port}") as pid:
        time.sleep(1.0 + workers)  # every worker listening, not just the first
        yield f"http://127.0.0.1:{port}", pid


@contextlib.contextmanager
def forwarder(upstream: str) -> Iterator[tuple[str, int]]:
    port = pb.free_port()
    cmd = [sys.executable, str(ROOT / "bench" / "reference_forwarder.py")]
    cmd += ["--engine", upstream, "--port", str(port), "--capture"]
    with pb.process(cmd, f"http://127.0.0.1:{port}") as pid:
        yield f"http://127.0.0.1:{port}", pid


@contextlib.contextmanager
def litellm(executable: str, upstream: str, tmp: str) -> Iterator[tuple[str, int]]:
    port = pb.free_port()
    config = Path(tmp) / f"litellm-{port}.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: fake-model\n"
        "    litellm_params:\n"
        "      model: openai/fake-model\n"
        f"      api_base: {upstream}/v1\n"
        "      api_key: none\n"
    )
    cmd = [executable, "--config", str(config), "--port", str(port), "--num_workers", "1"]
    # On loopback for one run: no master key, as the bench sends none to any proxy.
    env = {"LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true"}
    with pb.process(cmd, f"http://127.0.0.1:{port}", env=env) as pid:
        time.sleep(3.0)  # it accepts connections before its router is ready
        yield f"http://127.0.0.1:{port}", pid


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its children (the workers of --workers N)."""
    import psutil

    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


async def proxy_section(args: argparse.Namespace, tmp: str) -> None:
    print(f"capture throughput, {args.concurrency} clients (engine answers at once), calls/s:")
    rates: dict[str, dict[bool, float]] = {}
    with engine(0.0) as upstream:
        for stream in (False, True):
            direct = await pb.drive(
                f"{upstream}/v1/chat/completions", stream, args.concurrency, args.duration
            )
            rates.setdefault("engine direct", {})[stream] = direct.rate
        contenders: list[tuple[str, contextlib.AbstractContextManager[tuple[str, int]], bool]] = [
            ("bare capturing forwarder", forwarder(upstream), False),
            ("rolltap --workers 1", rolltap(upstream, 1, tmp), True),
            ("rolltap --workers 2", rolltap(upstream, 2, tmp), True),
        ]
        if args.litellm:
            contenders.append(("LiteLLM proxy", litellm(args.litellm, upstream, tmp), False))
        cpu: dict[str, dict[bool, float]] = {}
        for name, starting, keyed in contenders:
            print(f"  ({name}...)")
            with starting as (url, pid):
                for stream in (False, True):
                    urls: str | list[str] = f"{url}/v1/chat/completions"
                    if keyed:
                        urls = await pb.rollout_urls(url, "/v1/chat/completions", args.concurrency)
                    cpu0 = tree_cpu(pid)
                    result = await pb.drive(urls, stream, args.concurrency, args.duration)
                    rates.setdefault(name, {})[stream] = result.rate
                    spent = (tree_cpu(pid) - cpu0) / max(1, len(result.latencies))
                    cpu.setdefault(name, {})[stream] = spent
                    if result.errors:
                        print(f"  ({name}: {result.errors} errors)")
    litellm_rates = rates.get("LiteLLM proxy")
    for name, by_stream in rates.items():
        line = f"  {name:<26} non-streaming {by_stream[False]:7.0f}"
        line += f"   streaming {by_stream[True]:7.0f}"
        if name in cpu:
            line += f"   CPU {cpu[name][False] * 1e3:5.2f} / {cpu[name][True] * 1e3:5.2f} ms/call"
        if litellm_rates and name != "LiteLLM proxy" and name != "engine direct":
            ratios = [_ratio(by_stream[s], litellm_rates[s]) for s in (False, True)]
            line += f"   x LiteLLM: {ratios[0]} / {ratios[1]}"
        print(line)
    floor = cpu.get("bare capturing forwarder")
    for name, spent in cpu.items():
        if floor and name.startswith("rolltap"):
            ratios = [spent[s] / floor[s] for s in (False, True)]
            print(
                f"  {name + ' CPU / forwarder':<38} non-streaming {ratios[0]:5.2f} x"
                f"   streaming {ratios[1]:5.2f} x"
            )


def _ratio(rate: float, litellm: float) -> str:
    return f"{rate / litellm:5.1f}" if litellm else "  n/a (LiteLLM completed none)"


async def latency_section(args: argparse.Namespace, tmp: str) -> None:
    rounds = args.latency_rounds
    print(
        f"added latency at one client (non-streaming, engine answers at once), p50, median of "
        f"{rounds} interleaved rounds of {args.duration:g} s each:"
    )
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(engine(0.0))
        contenders = [
            ("bare capturing forwarder", forwarder(upstream), False),
            ("rolltap --workers 1", rolltap(upstream, 1, tmp), True),
        ]
        if Path("/dev/shm").is_dir():
            # The same commit on tmpfs, where it costs no disk: what the disk itself costs.
            shm = stack.enter_context(tempfile.TemporaryDirectory(dir="/dev/shm"))
            contenders.append(("rolltap, store on tmpfs", rolltap(upstream, 1, shm), True))
        # Each record appended to a plain file instead (bench/journal_serve.py): what the
        # store's transaction and the hand-off to its thread cost; the rest is rolltap's own.
        journal = rolltap(upstream, 1, tmp, journal=True)
        contenders.append(("rolltap, record to a file", journal, True))
        urls: dict[str, str | list[str]] = {}
        for name, starting, keyed in contenders:
            url, _ = stack.enter_context(starting)
            path = "/v1/chat/completions"
            urls[name] = await pb.rollout_urls(url, path, 1) if keyed else f"{url}{path}"
        added: dict[str, list[float]] = {name: [] for name in urls}
        for _ in range(rounds):
            # Each round measures the engine again, so a noisy minute shifts all alike.
            direct = await pb.drive(f"{upstream}/v1/chat/completions", False, 1, args.duration)
            base = direct.pct(direct.latencies, 0.5)
            for name, url in urls.items():
                result = await pb.drive(url, False, 1, args.duration)
                added[name].append(result.pct(result.latencies, 0.5) - base)
        median = {name: statistics.median(values) for name, values in added.items()}
        for name, value in median.items():
            rounds_text = " ".join(f"{v:.2f}" for v in added[name])
            print(f"  {name:<26} +{value:6.2f} ms   (rounds: {rounds_text})")
        floor = median["bare capturing forwarder"]
        for name in ("rolltap --workers 1", "rolltap, store on tmpfs", "rolltap, record to a file"):
            if name in median:
                print(f"  {name + ' / forwarder':<38} {median[name] / floor:6.2f} x")


async def ray_section(args: argparse.Namespace, tmp: str) -> None:
    import asyncpg
    import ray
    from ray.cluster_utils import Cluster

    from rolltap.runner.cluster.batch import run_batch_on_ray

    if shutil.which("bwrap") is None:
        print("Ray: skipped (needs bubblewrap)")
        return
    name = f"rolltap_bench_{os.getpid()}"
    conn = await asyncpg.connect(PG_ADMIN)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    db = f"postgresql+asyncpg://{PG_ADMIN.split('://', 1)[1].rsplit('/', 1)[0]}/{name}"
    tasks = Path(tmp) / "say.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"id": f"t{i:03d}", "instruction": f"say {i}", "test": "test -s answer.txt"})
            + "\n"
            for i in range(args.ray_rollouts)
        )
    )
    warm = Path(tmp) / "warm.jsonl"
    warm.write_text("".join(tasks.read_text().splitlines(keepends=True)[:12]))
    print(f"rollouts per minute, {args.ray_rollouts} single-call rollouts, bwrap, cap 4 per node:")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        with engine(1.0) as upstream:
            for nodes in (1, 2, 3):
                cluster.add_node(num_cpus=1, resources={"sandbox": 4})
                cluster.wait_for_nodes()
                # A warm-up batch first: Ray starts a node's worker processes on first use.
                await run_batch_on_ray(
                    warm,
                    address=cluster.address,
                    harness="single-call",
                    sandbox="bwrap",
                    backends=[upstream],
                    batch=f"warm-{nodes}",
                    db=db,
                )
                start = time.perf_counter()
                result = await run_batch_on_ray(
                    tasks,
                    address=cluster.address,
                    harness="single-call",
                    sandbox="bwrap",
                    backends=[upstream],
                    batch=f"bench-{nodes}",
                    db=db,
                )
                elapsed = time.perf_counter() - start
                ok = sum(1 for r in result.results if r.status.value == "finished")
                print(
                    f"  {nodes} node(s): {len(result.results) / elapsed * 60:7.0f} rollouts/min "
                    f"({elapsed:.1f} s, {ok} succeeded)"
                )
    finally:
        ray.shutdown()
        cluster.shutdown()
        conn = await asyncpg.connect(PG_ADMIN)
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.close()


async def postgres_section(args: argparse.Namespace) -> None:
    made = await store_bench._temporary_pg_database(PG_ADMIN)
    if made is None:
        print("PostgreSQL: skipped (no server)")
        return
    name, url = made
    print("PostgreSQL append rate (4,096-token prompts, 300-token answers), by writer concurrency:")
    try:
        for concurrency in (1, 4, 16, 64, 256):
            calls = max(200, concurrency * 8)
            rate, per_commit = await store_bench.append_throughput(url, calls, concurrency)
            print(
                f"  {concurrency:4d} calls in flight: {rate:7.0f} calls/s, "
                f"{per_commit:6.1f} calls per commit"
            )
    finally:
        await store_bench._drop_pg_database(PG_ADMIN, name)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--litellm", help="LiteLLM's `litellm` executable (its own venv)")
    parser.add_argument("--ray-rollouts", type=int, default=48)
    parser.add_argument("--latency-rounds", type=int, default=3)
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["proxy", "latency", "ray", "postgres"]
    )
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    print(f"{os.cpu_count()} cores; prompts {pb.PROMPT_TOKENS} tokens, answers {pb.ANSWER_TOKENS}")
    with tempfile.TemporaryDirectory() as tmp:
        if "proxy" not in args.skip:
            await proxy_section(args, tmp)
        if "latency" not in args.skip:
            await latency_section(args, tmp)
        if "postgres" not in args.skip:
            await postgres_section(args)
        if "ray" not in args.skip:
            await ray_section(args, tmp)


if __name__ == "__main__":
    asyncio.run(main())
