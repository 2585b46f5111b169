"""The fault suite: `rolltap serve` on a SQLite file and the fake engine, each a process of its
own, under concurrent streaming clients of all three dialects, and one fault at a time.

- the proxy is SIGKILLed under 64 clients, then restarted on the same store;
- the engine is SIGKILLed mid-stream, then started again;
- the engine answers with malformed chunks and bodies.

After each, the invariant: every answer a client received complete has its record, with the ids
the engine sent; every request the engine saw (its log of X-Request-Id, written as requests
arrive) has a record, ok, failed or cancelled (except the calls in flight in a proxy that was
killed: there is no process left to record them); and the proxy serves again. (Stopping
PostgreSQL mid-run is tests/store's.)
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from pathlib import Path

import aiohttp
import orjson
import pytest

from rolltap.analysis.reading import rollout_trajectories
from rolltap.store import CallStatus, Capture, NotFound, Store
from tests.support.fake_vllm import (
    BadIds,
    ErrorEvent,
    Fault,
    Garble,
    NoLogprob,
    decode,
    read_log,
)
from tests.support.load import Outcome, call, keep_calling
from tests.support.processes import Child, free_port, reaped, start_fake_engine, start_serve

pytestmark = pytest.mark.slow

DIALECTS = ["chat", "responses", "messages"]


async def new_keys(proxy: Child, n: int) -> list[str]:
    async with aiohttp.ClientSession() as session:
        keys = []
        for _ in range(n):
            async with session.post(proxy.url + "/admin/rollouts", json={}) as resp:
                assert resp.status == 201, await resp.text()
                keys.append((await resp.json())["key"])
        return keys


async def load_until(proxy: Child, keys: list[str], enough: asyncio.Event) -> list[Outcome]:
    """One streaming client per key, calling until `enough` is set; their outcomes."""
    outcomes: list[Outcome] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        clients = [
            asyncio.create_task(
                keep_calling(
                    session, f"{proxy.url}/r/{key}", DIALECTS[i % 3:] + DIALECTS[: i % 3],
                    outcomes, enough,
                )
            )
            for i, key in enumerate(keys)
        ]  # fmt: skip
        await asyncio.gather(*clients)
    return outcomes


async def assert_acknowledged_are_recorded(store: Store, outcomes: list[Outcome], log: Path) -> int:
    """Every complete answer is recorded ok with exactly the ids the engine sent for it."""
    _, sent = read_log(str(log))
    complete = [o for o in outcomes if o.complete]
    for outcome in complete:
        assert outcome.call_id is not None
        record = await store.call(outcome.call_id)
        assert record.status is CallStatus.OK
        tokens = await store.call_tokens(record.id)
        engine = sent[outcome.call_id]
        assert tokens.prompt_ids.tolist() == engine.prompt
        assert [c.token_ids.tolist() for c in tokens.choices] == engine.choices
        assert outcome.text == decode(engine.choices[0])
    return len(complete)


async def assert_engine_calls_are_recorded(store: Store, log: Path) -> Counter[str]:
    """Every request the engine saw has its record; the statuses, counted."""
    seen, _ = read_log(str(log))
    statuses: Counter[str] = Counter()
    for request_id in seen:
        try:
            record = await store.call(request_id)
        except NotFound:
            raise AssertionError(f"the engine served {request_id}, which has no record") from None
        assert record.status in (CallStatus.OK, CallStatus.FAILED, CallStatus.CANCELLED)
        statuses[record.status.value] += 1
    return statuses


async def assert_serves(proxy: Child, key: str) -> None:
    async with aiohttp.ClientSession() as session:
        for dialect in DIALECTS:
            outcome = await call(session, f"{proxy.url}/r/{key}", dialect, "again", stream=True)
            assert outcome.complete, outcome


async def test_proxy_killed_under_64_streaming_clients(
    tmp_path: Path, store: Store, db_url: str
) -> None:
    engine_log = tmp_path / "engine.jsonl"
    engine = start_fake_engine(tmp_path, free_port(), engine_log, token_delay_ms=4, reply_tokens=40)
    db = db_url
    proxy_port = free_port()
    # An fsync per commit (power-loss durability) widens the window between an answer's end
    # and its record: an ending sent before the record would be caught here.
    serve = start_serve(tmp_path, proxy_port, db + "?synchronous=full", engine.url)
    with reaped(engine, serve) as children:
        proxy = children[1]
        await engine.ready("/health")
        await proxy.ready("/health")
        keys = await new_keys(proxy, 64)
        enough = asyncio.Event()
        load = asyncio.create_task(load_until(proxy, keys, enough))
        _, sent = read_log(str(engine_log))
        while len(sent) < 300:  # a few hundred answers in, with 64 streams open
            await asyncio.sleep(0.1)
            _, sent = read_log(str(engine_log))

        proxy.kill()
        enough.set()
        outcomes = await load

        broken = sum(o.broken for o in outcomes)
        assert broken > 0  # the kill landed mid-stream
        complete = await assert_acknowledged_are_recorded(store, outcomes, engine_log)
        assert complete >= 100
        # What the kill took is at most the calls in flight: one per client.
        seen, _ = read_log(str(engine_log))
        unrecorded = [r for r in seen if not await _recorded(store, r)]
        assert len(unrecorded) <= len(keys)
        # Restarted on the same store, it picks up where it was.
        restarted = start_serve(tmp_path, proxy_port, db, engine.url)
        children.append(restarted)
        await restarted.ready("/health")
        await assert_serves(restarted, keys[0])
        assert_store_consistent(db)
        for key_index in range(0, 64, 16):
            rollout = await store.rollout_by_key(keys[key_index])
            assert rollout is not None
            await rollout_trajectories(store, rollout.id)  # every record reads back whole
        print(
            f"proxy SIGKILL: {len(outcomes)} calls, {complete} complete, {broken} cut, "
            f"{len(unrecorded)} of {len(seen)} engine calls died with the proxy unrecorded"
        )


async def _recorded(store: Store, call_id: str) -> bool:
    try:
        await store.call(call_id)
    except NotFound:
        return False
    return True


def assert_store_consistent(db_url: str) -> None:
    database = sqlite3.connect(db_url.removeprefix("sqlite:///"))
    try:
        assert database.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert database.execute("PRAGMA foreign_key_check").fetchall() == []
        # Each rollout's calls are numbered without a gap: no half-written transaction.
        rows = database.execute(
            "SELECT rollout_id, COUNT(*), MIN(seq), MAX(seq) FROM call GROUP BY rollout_id"
        ).fetchall()
        for rollout_id, count, low, high in rows:
            assert high - low + 1 == count, rollout_id
    finally:
        database.close()


async def test_engine_killed_mid_stream(tmp_path: Path, store: Store, db_url: str) -> None:
    engine_log = tmp_path / "engine.jsonl"
    engine_port = free_port()
    engine = start_fake_engine(
        tmp_path, engine_port, engine_log, token_delay_ms=10, reply_tokens=200
    )
    db = db_url
    with reaped(engine, start_serve(tmp_path, free_port(), db, engine.url)) as children:
        proxy = children[1]
        await engine.ready("/health")
        await proxy.ready("/health")
        keys = await new_keys(proxy, 16)
        enough = asyncio.Event()
        load = asyncio.create_task(load_until(proxy, keys, enough))
        seen, sent = read_log(str(engine_log))
        while len(sent) < 16 or len(seen) - len(sent) < 12:  # answers done, and more mid-way
            await asyncio.sleep(0.05)
            seen, sent = read_log(str(engine_log))

        engine.kill()
        enough.set()
        outcomes = await load

        cut = [o for o in outcomes if not o.complete]
        assert cut
        # A stream the engine dropped ends with the dialect's error event, never cut mid-air.
        assert all(o.error_event for o in cut if o.status == 200), cut
        await assert_acknowledged_are_recorded(store, outcomes, engine_log)
        statuses = await assert_engine_calls_are_recorded(store, engine_log)
        assert statuses["failed"] >= 1
        failed = [o for o in cut if o.call_id is not None]
        for outcome in failed:
            record = await store.call(outcome.call_id or "")
            assert (record.status, record.http_status) == (CallStatus.FAILED, 502)
            # What the engine sent before it died is kept. A stream cut before its first token
            # has no choice row (nothing was sampled), and then the client saw no text either.
            tokens = await store.call_tokens(record.id)
            kept = decode(tokens.choices[0].token_ids.tolist()) if tokens.choices else ""
            assert kept.startswith(outcome.text)
        # The proxy is still up; with the engine back, it serves again.
        children.append(
            start_fake_engine(tmp_path, engine_port, engine_log, token_delay_ms=0, reply_tokens=20)
        )
        await children[-1].ready("/health")
        for _ in range(300):  # its health checks find the engine back
            async with aiohttp.ClientSession() as session, session.get(proxy.url + "/health") as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.1)
        await assert_serves(proxy, keys[0])
        print(f"engine SIGKILL: {len(outcomes)} calls, {dict(statuses)}")


FAULTS: list[tuple[Fault | None, bool]] = [
    (Garble(4), True),
    (NoLogprob(3), True),
    (ErrorEvent(5), True),
    (BadIds(2), True),
    (Garble(), False),
    (NoLogprob(), False),
    (BadIds(), False),
    (None, True),
    (None, False),
]


def spec(fault: Fault | None) -> str:
    """What a client writes in its message to pick the fault for its call."""
    return "none" if fault is None else fault.spec


async def test_engine_sending_malformed_chunks_and_bodies(
    tmp_path: Path, store: Store, db_url: str
) -> None:
    engine_log = tmp_path / "engine.jsonl"
    engine = start_fake_engine(tmp_path, free_port(), engine_log, token_delay_ms=1, reply_tokens=30)
    db = db_url
    with reaped(engine, start_serve(tmp_path, free_port(), db, engine.url)) as children:
        proxy = children[1]
        await engine.ready("/health")
        await proxy.ready("/health")
        keys = await new_keys(proxy, len(FAULTS) * len(DIALECTS))
        cases = [(f, s, d) for f, s in FAULTS for d in DIALECTS]
        async with aiohttp.ClientSession() as session:
            outcomes = await asyncio.gather(
                *(
                    call(session, f"{proxy.url}/r/{key}", dialect, f"say fault={spec(f)}", stream)
                    for key, (f, stream, dialect) in zip(keys, cases, strict=True)
                )
            )

        for (fault, stream, dialect), outcome in zip(cases, outcomes, strict=True):
            where = f"{spec(fault)} {dialect} {'stream' if stream else 'whole'}"
            if fault is None or isinstance(fault, BadIds):
                assert outcome.complete, where
            elif stream:
                # A well-formed stream that ends in the dialect's error event.
                assert (outcome.status, outcome.error_event, outcome.broken) == (200, True, False)
            else:
                assert outcome.status == 502, where
        await assert_acknowledged_are_recorded(
            store, [o for o, (f, _, _) in zip(outcomes, cases, strict=True) if f is None],
            engine_log,
        )  # fmt: skip
        statuses = await assert_engine_calls_are_recorded(store, engine_log)
        assert statuses == {"ok": 4 * len(DIALECTS), "failed": 5 * len(DIALECTS)}
        for key, (fault, _, _) in zip(keys, cases, strict=True):
            rollout = await store.rollout_by_key(key)
            assert rollout is not None
            (record,) = await store.calls(rollout.id)
            if isinstance(fault, BadIds):
                # The store refused the ids; the call is kept without them, and says why.
                assert record.capture is Capture.NONE
                assert "token data dropped" in (record.error or "")
            if isinstance(fault, Garble):
                response = (await store.call_bodies(record.id)).response or b""
                with pytest.raises(orjson.JSONDecodeError):
                    orjson.loads(response)  # the engine's unreadable bytes, as they came
        await assert_serves(proxy, keys[0])
