"""Built-in backend throughput: single-stream tokens/s against aggregate tokens/s at N streams.

    python bench/backend_bench.py [--url http://127.0.0.1:8200] [--streams 8] [--tokens 64]
                                  [--rounds 3] [--prefix [--context 2000]]
                                  [-- extra `rolltap model serve` args]

Without --url it starts its own engine (default SmolLM2, CPU) as a child process. Each stream is
a streaming chat completion with `ignore_eos` and a fixed `max_tokens`, so every stream produces
exactly --tokens tokens; throughput counts tokens from the first request sent to the last token
received (prefill included). Rounds alternate single and concurrent runs; the best round of each
is reported, which is the least disturbed by whatever else the machine is doing.

--prefix measures prefix caching instead: the second turn of a conversation whose first turn is
--context tokens long (prompt = first prompt + its answer + a new user message), time to first
token with the cache and without it (a fresh `cache_salt` per request sees an empty cache), and
the largest difference between the two runs' logprobs (greedy, so the ids must be equal).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from rolltap.engine.launch import EngineProcess

QUESTIONS = [
    "Tell me a story about a cat.",
    "Why is the sky blue?",
    "Describe the city of Paris.",
    "How do airplanes fly?",
    "Write a poem about the sea.",
    "What is machine learning?",
    "Explain photosynthesis.",
    "Give me a recipe for pancakes.",
]


@dataclass(frozen=True)
class Run:
    streams: int
    tokens: int
    seconds: float
    first_token_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


async def stream_one(
    session: aiohttp.ClientSession, url: str, model: str, index: int, max_tokens: int
) -> tuple[int, float]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.8,
        "stream": True,
        "return_token_ids": True,
    }
    started = time.perf_counter()
    first = 0.0
    tokens = 0
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            got = len(choice.get("token_ids", ()))
            if got and not tokens:
                first = time.perf_counter() - started
            tokens += got
    return tokens, first


async def run(url: str, model: str, streams: int, max_tokens: int) -> Run:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        started = time.perf_counter()
        results = await asyncio.gather(
            *(stream_one(session, url, model, i, max_tokens) for i in range(streams))
        )
        seconds = time.perf_counter() - started
    tokens = sum(t for t, _ in results)
    return Run(streams, tokens, seconds, max(f for _, f in results))


async def bench(url: str, model: str, streams: int, max_tokens: int, rounds: int) -> None:
    await run(url, model, 1, 4)  # warm the HTTP path
    singles, concurrent = [], []
    for _ in range(rounds):
        singles.append(await run(url, model, 1, max_tokens))
        concurrent.append(await run(url, model, streams, max_tokens))
    single = max(singles, key=lambda r: r.tokens_per_s)
    many = max(concurrent, key=lambda r: r.tokens_per_s)
    async with aiohttp.ClientSession() as session, session.get(url + "/stats") as resp:
        stats = await resp.json()
    print(f"engine {url} model {model}, {max_tokens} tokens per stream, best of {rounds} rounds")
    for label, r in (("single stream", single), (f"{streams} streams", many)):
        print(
            f"  {label:>14}: {r.tokens_per_s:7.1f} tokens/s aggregate "
            f"({r.tokens} tokens in {r.seconds:.2f} s, last first-token {r.first_token_s:.2f} s)"
        )
    print(f"  speed-up: {many.tokens_per_s / single.tokens_per_s:.2f}x")
    print(f"  all rounds single: {[round(r.tokens_per_s, 1) for r in singles]}")
    print(f"  all rounds {streams} streams: {[round(r.tokens_per_s, 1) for r in concurrent]}")
    print(f"  max batch seen by the engine: {stats['max_batch_seen']}")


async def chat_stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[float, list[int], list[float], str]:
    """Stream one chat completion: (time to first token, ids, logprobs, text)."""
    started = time.perf_counter()
    first = 0.0
    ids: list[int] = []
    logprobs: list[float] = []
    text = ""
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            if choice.get("token_ids") and not ids:
                first = time.perf_counter() - started
            ids += choice.get("token_ids", [])
            logprobs += [e["logprob"] for e in (choice.get("logprobs") or {}).get("content", [])]
            text += choice["delta"].get("content", "")
    return first, ids, logprobs, text


async def long_system_prompt(session: aiohttp.ClientSession, url: str, tokens: int) -> str:
    lines: list[str] = []
    count = 0
    while count < tokens:
        n = len(lines)
        lines.append(f"Rule {n}: {QUESTIONS[n % len(QUESTIONS)]} Answer it in {n % 7 + 2} words.")
        if n % 25 == 0:
            async with session.post(url + "/tokenize", json={"prompt": "\n".join(lines)}) as resp:
                count = (await resp.json())["count"]
    return "\n".join(lines)


async def prefix_bench(url: str, model: str, context: int, rounds: int) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        system = await long_system_prompt(session, url, context)
        results: dict[str, list[float]] = {"cached": [], "uncached": []}
        worst = 0.0
        for r in range(rounds):
            # A fresh conversation each round: nothing but this round's first turn is cached.
            messages = [
                {"role": "system", "content": f"Session {r} at {time.time()}.\n{system}"},
                {"role": "user", "content": "Which rule mentions Paris?"},
            ]
            body: dict[str, Any] = {
                "model": model,
                "temperature": 0,
                "max_tokens": 32,
                "stream": True,
                "return_token_ids": True,
                "logprobs": True,
            }
            _, _, _, answer = await chat_stream(session, url, {**body, "messages": messages})
            messages += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "And which one is about pancakes?"},
            ]
            second = {**body, "messages": messages}
            cold = {**second, "cache_salt": f"bench-{r}-{time.time()}"}
            t_cold, ids_cold, lp_cold, _ = await chat_stream(session, url, cold)
            t_hot, ids_hot, lp_hot, _ = await chat_stream(session, url, second)
            results["uncached"].append(t_cold)
            results["cached"].append(t_hot)
            assert ids_hot == ids_cold, "greedy ids differ with and without the prefix cache"
            worst = max([worst, *(abs(a - b) for a, b in zip(lp_hot, lp_cold, strict=True))])
        async with session.get(url + "/stats") as resp:
            stats = await resp.json()
    print(f"engine {url}: second turn of a {context}-token conversation, {rounds} rounds")
    for label, times in results.items():
        print(
            f"  {label:>8}: time to first token best {min(times):.2f} s, "
            f"median {statistics.median(times):.2f} s, all {[round(t, 2) for t in times]}"
        )
    speedup = statistics.median(results["uncached"]) / statistics.median(results["cached"])
    print(f"  speed-up (median): {speedup:.1f}x")
    print(f"  greedy ids identical; largest logprob difference {worst:.2e}")
    print(
        f"  engine: {stats['prefix_cache_hits']} hits, {stats['prefix_cache_hit_tokens']} tokens "
        f"reused, {stats['prefix_cache_tokens']} held"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="an engine already running (default: start one)")
    parser.add_argument("--model", help="served model name when --url is given")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefix", action="store_true", help="measure prefix caching instead")
    parser.add_argument("--context", type=int, default=2000, help="first-turn tokens (--prefix)")
    parser.add_argument("serve_args", nargs="*", help="extra `rolltap model serve` arguments")
    args = parser.parse_args()

    def measure(url: str, model: str) -> None:
        if args.prefix:
            asyncio.run(prefix_bench(url, model, args.context, args.rounds))
        else:
            asyncio.run(bench(url, model, args.streams, args.tokens, args.rounds))

    if args.url:
        measure(args.url, args.model)
        return
    with EngineProcess.start(extra_args=args.serve_args) as engine:
        measure(engine.url, engine.model)


if __name__ == "__main__":
    main()
