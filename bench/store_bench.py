"""Store benchmark: append throughput, bytes per unique token, full-array read speed, and the
cost of the hash chain (hashing per call beside the append time; verifying a rollout).

    python bench/store_bench.py [--calls 5000] [--concurrency 256] [--no-postgres]

Appends calls with 4,096-token prompts and 300-token completions (with logprobs and a realistic
compressed request body) from many concurrent tasks, as the proxy does, on SQLite and on
PostgreSQL (a temporary database on 127.0.0.1:5432). Then builds one 50-turn rollout growing to
32k tokens and reports bytes stored per unique token, and how fast full arrays read back.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import numpy as np
from sqlalchemy import func, select

from rolltap.audit.integrity import verify_rollout
from rolltap.store import (
    CallDialect,
    CallRecord,
    CallStatus,
    Capture,
    ChoiceRecord,
    NewRollout,
    Store,
    chain,
)
from rolltap.store.models import call_table, choice_table

PROMPT, COMPLETION = 4096, 300
WORDS = np.array(["the", "of", "and", "to", "in", "is", "for", "that", "with", "on", "as", "by"])


def _record(rollout_id: str, rng: np.random.Generator, prompt: np.ndarray) -> CallRecord:
    completion = rng.integers(0, 49_152, COMPLETION)
    body = " ".join(rng.choice(WORDS, PROMPT)).encode()  # ~4 bytes of JSON text per token
    return CallRecord(
        rollout_id=rollout_id,
        dialect=CallDialect.CHAT,
        status=CallStatus.OK,
        capture=Capture.TOKENS,
        received_at=datetime.now(UTC),
        prompt_ids=prompt,
        choices=[ChoiceRecord(0, completion, -rng.exponential(1.0, COMPLETION).astype(np.float32))],
        request_body=b'{"messages":[{"role":"user","content":"' + body + b'"}]}',
        response_body=b'{"choices":[{"message":{"content":"' + body[:1200] + b'"}}]}',
    )


async def append_throughput(url: str, calls: int, concurrency: int) -> tuple[float, float]:
    store = await Store.connect(url)
    rng = np.random.default_rng(0)
    rollouts = [
        (await store.create_rollout(NewRollout(task_id=f"bench-{i}"))).id
        for i in range(concurrency)
    ]
    records = [
        _record(rollouts[i % concurrency], rng, rng.integers(0, 49_152, PROMPT))
        for i in range(calls)
    ]
    semaphore = asyncio.Semaphore(concurrency)

    async def one(record: CallRecord) -> None:
        async with semaphore:
            await store.append_call(record)

    commits = store.commits
    start = time.perf_counter()
    await asyncio.gather(*(one(r) for r in records))
    elapsed = time.perf_counter() - start
    per_commit = calls / max(1, store.commits - commits)
    await store.close()
    return calls / elapsed, per_commit


def chain_cost(calls: int) -> float:
    """Microseconds to digest and link one of the append benchmark's records (one thread)."""
    rng = np.random.default_rng(0)
    records = [_record("r", rng, rng.integers(0, 49_152, PROMPT)) for _ in range(min(calls, 500))]
    start = time.perf_counter()
    prev = chain.GENESIS
    for r in records:
        row = {name: getattr(r, name, None) for name in chain.CALL_FIELDS}
        row |= {"id": "c", "prompt_tokens": PROMPT, "completion_tokens": COMPLETION, "n_choices": 1}
        choices = [
            {
                "idx": c.index,
                "finish_reason": c.finish_reason,
                "n_tokens": len(c.token_ids),
                "token_ids": c.token_ids.tobytes(),
                "logprobs": None if c.logprobs is None else c.logprobs.tobytes(),
            }
            for c in r.choices
        ]
        prompt = np.asarray(r.prompt_ids, dtype="<i4").tobytes()
        bodies = [chain.body_digest(b) for b in (r.request_body, None, r.response_body)]
        prev = chain.link(prev, chain.call_digest(row, prompt, choices, bodies))
    return (time.perf_counter() - start) / len(records) * 1e6


async def growing_rollout(url: str) -> tuple[int, int, int, float]:
    """(unique tokens, payload bytes, calls, tokens/s read) for a 50-turn rollout to 32k."""
    store = await Store.connect(url)
    rng = np.random.default_rng(1)
    rollout = (await store.create_rollout(NewRollout(task_id="grow"))).id
    turns, completion_len = 50, 300
    tool_len = (32_768 - 2_000) // turns - completion_len
    prompt = rng.integers(0, 49_152, 2_000)
    for _ in range(turns):
        completion = rng.integers(0, 49_152, completion_len)
        await store.append_call(
            CallRecord(
                rollout_id=rollout,
                dialect=CallDialect.CHAT,
                status=CallStatus.OK,
                capture=Capture.TOKENS,
                received_at=datetime.now(UTC),
                prompt_ids=prompt,
                choices=[ChoiceRecord(0, completion, -rng.exponential(1.0, completion_len))],
            )
        )
        prompt = np.concatenate([prompt, completion, rng.integers(0, 49_152, tool_len)])
    unique = len(prompt) - tool_len
    async with store.db.connect() as conn:
        suffix = await conn.scalar(
            select(func.sum(func.length(call_table.c.prompt_suffix))).where(
                call_table.c.rollout_id == rollout
            )
        )
        choices = await conn.scalar(
            select(
                func.sum(
                    func.length(choice_table.c.token_ids) + func.length(choice_table.c.logprobs)
                )
            )
            .join(call_table, call_table.c.id == choice_table.c.call_id)
            .where(call_table.c.rollout_id == rollout)
        )
    payload = int(suffix) + int(choices)

    reads, tokens, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < 3.0:
        arrays = await store.rollout_tokens(rollout)
        tokens += sum(len(t.prompt_ids) + len(t.choices[0].token_ids) for t in arrays.values())
        reads += 1
    rate = tokens / (time.perf_counter() - start)
    start = time.perf_counter()
    verified = await verify_rollout(store, rollout)
    assert verified.ok, verified.issues
    print(f"    verify_rollout of it: {(time.perf_counter() - start) * 1000:.0f} ms")
    await store.close()
    return unique, payload, turns, rate


def _checkpointed_size(path: Path) -> int:
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path.stat().st_size


async def _temporary_pg_database(admin_dsn: str) -> tuple[str, str] | None:
    name = f"rolltap_bench_{uuid.uuid4().hex[:8]}"
    try:
        conn = await asyncpg.connect(admin_dsn, timeout=3)
    except (OSError, asyncpg.PostgresError) as e:
        print(f"PostgreSQL skipped: {e}")
        return None
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    host = admin_dsn.split("://", 1)[1].rsplit("/", 1)[0]
    return name, f"postgresql+asyncpg://{host}/{name}"


async def _drop_pg_database(admin_dsn: str, name: str) -> None:
    conn = await asyncpg.connect(admin_dsn)
    await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await conn.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument(
        "--pg-admin",
        default=os.environ.get("ROLLTAP_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        targets = [("SQLite", f"sqlite:///{Path(tmp) / 'bench.sqlite'}")]
        pg = None if args.no_postgres else await _temporary_pg_database(args.pg_admin)
        if pg is not None:
            targets.append(("PostgreSQL", pg[1]))
        try:
            print(f"append: {PROMPT}-token prompts, {COMPLETION}-token completions + logprobs,")
            print(f"        request/response bodies, {args.concurrency} concurrent writers")
            for name, url in targets:
                rates = []
                for _ in range(3):
                    rate, per_commit = await append_throughput(url, args.calls, args.concurrency)
                    rates.append(rate)
                print(
                    f"  {name:<10} {statistics.median(rates):8.0f} calls/s (median of 3; "
                    f"{per_commit:.0f} calls per commit)"
                )
                cost = chain_cost(args.calls)
                share = cost / (1e6 / statistics.median(rates))
                print(f"             hash chain: {cost:.0f} us per call, {share:.0%} of its append")
            print("50-turn rollout growing to 32k tokens (ids + logprobs):")
            grow_file = Path(tmp) / "grow.sqlite"
            targets[0] = ("SQLite", f"sqlite:///{grow_file}")
            await (await Store.connect(targets[0][1])).close()
            empty = _checkpointed_size(grow_file)
            for name, url in targets:
                unique, payload, _, rate = await growing_rollout(url)
                print(
                    f"  {name:<10} {payload / unique:5.2f} bytes per unique token "
                    f"({payload} bytes, {unique} unique tokens); "
                    f"full-array reads {rate / 1e6:6.1f} M tokens/s"
                )
                if name == "SQLite":
                    on_disk = _checkpointed_size(grow_file) - empty
                    print(
                        f"  {'':<10} {on_disk / unique:5.2f} bytes per unique token on disk "
                        "(whole file growth: rows, indexes, page slack)"
                    )
        finally:
            if pg is not None:
                await _drop_pg_database(args.pg_admin, pg[0])


if __name__ == "__main__":
    asyncio.run(main())
