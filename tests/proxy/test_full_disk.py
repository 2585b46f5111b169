"""The store's disk fills under load, then space comes back: the proxy refuses new calls before
any engine samples them (the client's own error shape, Retry-After), answers every call it did
sample once its record is written, and serves new rollouts within seconds of the space coming
back, without a restart.

The SQLite store lives on a 24 MB tmpfs of the test's own (as root; skipped elsewhere), filled
with a file until the filesystem has no byte left, as a full disk on a shared machine is.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from rolltap.proxy.server import RunningProxy
from rolltap.store import CallStatus, Store
from tests.support.private_postgres import private_postgres, private_postgres_unavailable_reason
from tests.support.proxy import fake_engine, new_rollout, running_proxy
from tests.support.stores import opened_store

CLIENTS = 8
PROMPT_BYTES = 6000
OUTAGE_LIMIT = 20.0
FULL_FOR = 10.0
"""Seconds the disk stays full: long enough for every client to be refused many times."""


@contextlib.contextmanager
def small_disk(size_mb: int) -> Iterator[Path]:
    """A tmpfs of `size_mb` of the test's own (skipped where it cannot be mounted)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = Path(tempfile.mkdtemp(prefix="rolltap-full-disk-"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        where.chmod(0o755)  # PostgreSQL's own user makes its data directory in it
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        with contextlib.suppress(OSError):
            where.rmdir()


@contextlib.asynccontextmanager
async def store_on_a_small_disk(kind: str) -> AsyncIterator[tuple[Store, Path]]:
    """A SQLite file on a 24 MB tmpfs, or a private PostgreSQL server with its data on a 96 MB
    one (initdb alone writes about 40 MB)."""
    if kind == "sqlite":
        with small_disk(24) as disk:
            url = f"sqlite:///{disk / 'store.sqlite'}"
            async with opened_store(url, outage_limit=OUTAGE_LIMIT) as store:
                yield store, disk
        return
    reason = private_postgres_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with small_disk(96) as disk, private_postgres(under=disk) as pg:
        async with opened_store(pg.url, outage_limit=OUTAGE_LIMIT) as store:
            yield store, disk


def fill(disk: Path) -> Path:
    """Write a file until the filesystem refuses another byte."""
    filler = disk / "filler"
    chunk = b"\0" * (1 << 16)
    with filler.open("wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
        small = b"\0" * 512
        while True:
            try:
                f.write(small)
            except OSError:
                break
    return filler


@dataclass
class Load:
    """Closed-loop clients, each on its own rollout, half streaming, each prompt distinct."""

    proxy: RunningProxy
    keys: list[str]
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    answered: int = 0
    refused: int = 0
    """Refused before sampling: 503, Retry-After, the OpenAI error shape."""
    failed: Counter[str] = field(default_factory=Counter)
    """Anything else a client got: a status, a timeout, a broken stream."""
    longest: float = 0.0
    """The longest any call waited for its answer (s)."""
    n: int = 0

    async def client(self, i: int) -> None:
        url = f"{self.proxy.url}/r/{self.keys[i]}/v1/chat/completions"
        stream = i % 2 == 1
        timeout = aiohttp.ClientTimeout(total=OUTAGE_LIMIT + 15)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not self.stop.is_set():
                self.n += 1
                content = f"{self.n} " + "x" * PROMPT_BYTES
                body = {"model": "m", "messages": [{"role": "user", "content": content}]}
                started = time.monotonic()
                try:
                    async with session.post(url, json={**body, "stream": stream}) as resp:
                        raw = await resp.read()
                except (TimeoutError, aiohttp.ClientError) as e:
                    self.failed[type(e).__name__] += 1
                    continue
                finally:
                    self.longest = max(self.longest, time.monotonic() - started)
                if resp.status == 200 and (not stream or raw.rstrip().endswith(b"[DONE]")):
                    self.answered += 1
                elif resp.status == 503 and resp.headers.get("Retry-After"):
                    error = orjson.loads(raw)["error"]
                    assert error["type"] == "service_unavailable", error
                    self.refused += 1
                    await asyncio.sleep(0.1)
                else:
                    self.failed[f"{resp.status} {raw[-200:]!r}"] += 1


async def _health(proxy: RunningProxy) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/health") as resp:
        data: dict[str, Any] = await resp.json()
        return data


async def _until(check: Any, within: float) -> float:
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < within, "not reached in time"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_full_disk_refuses_new_calls_and_recovers_by_itself(kind: str) -> None:
    async with (
        store_on_a_small_disk(kind) as (store, small_disk),
        fake_engine() as engine,
        running_proxy(store, engine.url) as proxy,
    ):
        rollouts = [await new_rollout(store) for _ in range(CLIENTS)]
        load = Load(proxy, [key for _, key in rollouts])
        clients = [asyncio.create_task(load.client(i)) for i in range(CLIENTS)]
        try:
            await _until(lambda: _answered(load, 5 * CLIENTS), within=30)
            # Made before the disk fills: creating a rollout is a write too.
            _, probe = await new_rollout(store)
            filler = fill(small_disk)

            async def full() -> bool:
                health = await _health(proxy)
                return health["store"] == "full"

            await _until(full, within=10)
            health = await _health(proxy)
            assert health["status"] == "degraded"
            assert "disk" in health["reason"], health
            # A new call while the disk is full: refused before any engine is asked (its
            # answer would wait on a record that cannot be written), in OpenAI's error shape.
            served = engine.fake.served
            probes = [await _probe(proxy, probe) for _ in range(3)]
            assert engine.fake.served == served, "a refused call reached the engine"
            for status_code, retry_after, error in probes:
                assert status_code == 503
                assert retry_after is not None
                assert int(retry_after) >= 1
                assert error["error"]["code"] == "store_full", error
                assert error["error"]["type"] == "service_unavailable"
            await asyncio.sleep(FULL_FOR)
            filler.unlink()
            back = time.monotonic()
            # New rollouts are served within seconds of the space coming back.
            _, fresh = await new_rollout(store)
            status = await _until(lambda: _serves(proxy, fresh), within=5)
            answered_then = load.answered
            await _until(lambda: _answered(load, answered_then + 2 * CLIENTS), within=10)
            recovered = time.monotonic() - back
        finally:
            load.stop.set()
            await asyncio.gather(*clients)
        recorded = Counter[CallStatus]()
        for rollout_id, _ in rollouts:
            recorded.update(c.status for c in await store.calls(rollout_id))
        metrics = await _metrics(proxy)

    print(
        f"\n{kind} on a full disk: {load.answered} answered, {load.refused} refused with 503 "
        f"while full, {engine.fake.served} served by the engine, "
        f"{recorded[CallStatus.OK]} ok records, longest call {load.longest:.1f} s, a new "
        f"rollout served {status:.1f} s after the space came back, the load flowing again "
        f"after {recovered:.1f} s"
    )
    assert load.failed == Counter(), load.failed
    assert load.longest < OUTAGE_LIMIT + 5
    # Every answer a client received has its record.
    assert recorded[CallStatus.OK] == load.answered + 0
    assert 'kind="store_full"' in metrics


async def _probe(proxy: RunningProxy, key: str) -> tuple[int, str | None, Any]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{proxy.url}/r/{key}/v1/chat/completions", json=body) as resp,
    ):
        return resp.status, resp.headers.get("Retry-After"), orjson.loads(await resp.read())


async def _answered(load: Load, n: int) -> bool:
    return load.answered >= n


async def _serves(proxy: RunningProxy, key: str) -> bool:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{proxy.url}/r/{key}/v1/chat/completions", json=body) as resp,
    ):
        await resp.read()
        return resp.status == 200


async def _metrics(proxy: RunningProxy) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/metrics") as resp:
        return await resp.text()


async def test_calls_held_past_the_outage_limit_are_answered_and_their_records_spilled(
    tmp_path: Path,
) -> None:
    """The disk stays full past the outage limit: the calls the engine answered meanwhile get
    an error (none waits longer than the limit), their records go to the spill on another
    filesystem, and once space is back they are written to the store, marked, and the spill
    is emptied: every call the engine sampled has its record."""
    limit = 3.0
    spill = tmp_path / "spill"
    with small_disk(24) as disk:
        url = f"sqlite:///{disk / 'store.sqlite'}"
        async with (
            opened_store(url, outage_limit=limit, spill=spill) as store,
            fake_engine() as engine,
            running_proxy(store, engine.url) as proxy,
        ):
            rollouts = [await new_rollout(store) for _ in range(4)]
            load = Load(proxy, [key for _, key in rollouts])
            clients = [asyncio.create_task(load.client(i)) for i in range(4)]
            try:
                await _until(lambda: _answered(load, 20), within=30)
                filler = fill(disk)

                async def errored() -> bool:
                    # The held calls got their error; the clients' next calls are refused.
                    return sum(load.failed.values()) >= 1 and load.refused >= 8

                await _until(errored, within=limit + 10)

                async def spilled() -> bool:
                    return any(spill.rglob("*.spill"))

                await _until(spilled, within=5)
                filler.unlink()

                async def written() -> bool:
                    return not any(spill.rglob("*.spill"))

                await _until(written, within=15)
                flowing = load.answered + 8
                await _until(lambda: _answered(load, flowing), within=10)
            finally:
                load.stop.set()
                await asyncio.gather(*clients)
            calls = [c for rollout_id, _ in rollouts for c in await store.calls(rollout_id)]

    kept = [c for c in calls if (c.error or "").startswith("spilled")]
    print(
        f"\nfull past the {limit:.0f} s outage limit: {load.answered} answered, "
        f"{sum(load.failed.values())} answered with an error, {len(kept)} records written from "
        f"the spill, {len(calls)} records for {engine.fake.served} engine answers, longest "
        f"call {load.longest:.1f} s"
    )
    assert load.longest < limit + 5, "a call waited past the outage limit"
    assert kept, "no record came from the spill"
    assert all(c.status is CallStatus.FAILED for c in kept)
    # Every call the engine sampled has its record: ok (answered) or spilled (errored).
    assert len(calls) == engine.fake.served
    assert len([c for c in calls if c.status is CallStatus.OK]) == load.answered
