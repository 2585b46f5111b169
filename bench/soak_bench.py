"""Soak benchmark: the proxy under steady load for half an hour, watched for leaks and losses.

    python bench/soak_bench.py [--minutes 30] [--clients 64] [--store sqlite|postgres]
                               [--calls-per-rollout 16] [--window 10] [--reference-seconds 30]

Starts the fake vLLM engine (answers at once, 2,000-token prompts, 200-token answers) and
`rolltap serve --workers 1` in front of it, capturing into a fresh SQLite file or a fresh
PostgreSQL database (created on `--pg-admin`, 127.0.0.1 with trust auth, and dropped at the
end). `--clients` clients each run rollouts as a harness would: create one
(`POST /admin/rollouts`), make `--calls-per-rollout` calls, streamed and not in turn, then
finish it with a reward (`PATCH`), which has the proxy analyze and forget it; then the next.

Every `--interval` seconds (60) it prints the proxy's RSS and open file descriptors (its whole
process tree), its CPU per call in that interval (user + system, rollout creation and analysis
included), the store's size on disk and per call, the calls done and the calls lost so far
(client errors), and the machine's load. At the end it stops the load, counts the calls the
store holds against the calls the clients saw succeed (0 lost: every success is a row; a row
beyond the successes is a call the client gave up on after the proxy recorded it), checks every
rollout it finished is stored as finished, and says for each figure whether it stayed flat
after warm-up: its least-squares slope over the last `--window` minutes, as a change over that
window against its mean, within a tolerance (RSS 5%, the rest 10%). Descriptors follow the
calls in flight (client and engine connections), so it also prints them idle, before the load
and 40 s after it (past the proxy's keep-alive to the engine): a leak is what stays above the
start beyond the store's connection pools.

First, for scale, the bare capturing forwarder (bench/reference_forwarder.py --capture) under
the same mixed load for `--reference-seconds`: its CPU per call.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import proxy_bench as pb  # noqa: E402

PG_ADMIN = os.environ.get("ROLLTAP_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
TOLERANCE = {
    "rss_mb": 0.05,
    "fds": 0.10,
    "cpu_ms": 0.10,
    "calls": 0.10,
    "bytes_per_call": 0.10,
}
"""How far a figure may move over the window, against its mean, and still read as flat."""
IDLE_SECONDS = 40.0


@dataclass
class Tally:
    ok: int = 0
    errors: int = 0
    rollouts_finished: int = 0
    rollout_errors: int = 0
    last_error: str = ""


@dataclass
class Sample:
    minute: float
    calls: int
    rss_mb: float
    fds: int
    cpu_ms: float
    store_bytes: int
    bytes_per_call: float
    load: float


@dataclass
class Store:
    url: str
    """What `rolltap serve --db` takes."""
    file: Path | None = None
    """SQLite: the database file."""
    pg_dsn: str | None = None
    """PostgreSQL: the database for asyncpg."""


@contextlib.contextmanager
def process(args: list[str], port: int, log: Path) -> Iterator[int]:
    """A server process whose stderr goes to a file (a pipe nobody reads fills and blocks it
    within minutes), ready once its port accepts connections."""
    with log.open("wb") as err:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{args[:4]} exited: {log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{args[:4]} did not listen on {port}") from None
                time.sleep(0.1)
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def tree_figures(pid: int) -> tuple[float, float, int]:
    """CPU seconds, RSS MB and open file descriptors of a process and its children."""
    cpu, rss, fds = 0.0, 0, 0
    for p in tree(pid):
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            cpu += t.user + t.system
            rss += p.memory_info().rss
            fds += p.num_fds()
    return cpu, rss / 2**20, fds


async def store_size(store: Store) -> int:
    if store.file is not None:
        files = [store.file, Path(f"{store.file}-wal"), Path(f"{store.file}-shm")]
        return sum(f.stat().st_size for f in files if f.exists())
    import asyncpg

    conn = await asyncpg.connect(store.pg_dsn)
    try:
        return int(await conn.fetchval("SELECT pg_database_size(current_database())"))
    finally:
        await conn.close()


async def stored_counts(store: Store) -> tuple[int, int]:
    """Calls, and rollouts stored as finished."""
    calls = "SELECT count(*) FROM call"
    finished = "SELECT count(*) FROM rollout WHERE status = 'finished'"
    if store.file is not None:
        with contextlib.closing(sqlite3.connect(store.file)) as db:
            return db.execute(calls).fetchone()[0], db.execute(finished).fetchone()[0]
    import asyncpg

    conn = await asyncpg.connect(store.pg_dsn)
    try:
        return int(await conn.fetchval(calls)), int(await conn.fetchval(finished))
    finally:
        await conn.close()


def answered(stream: bool, status: int, data: bytes) -> bool:
    if status != 200:
        return False
    return b"[DONE]" in data[-64:] if stream else b'"choices"' in data


async def client(
    session: aiohttp.ClientSession,
    proxy: str,
    index: int,
    per_rollout: int,
    stop: asyncio.Event,
    tally: Tally,
) -> None:
    """Rollouts one after another, as one harness slot of a batch runs them."""
    timeout = aiohttp.ClientTimeout(total=120)
    n = 0
    while not stop.is_set():
        try:
            async with session.post(f"{proxy}/admin/rollouts", json={"task_id": "soak"}) as resp:
                created = await resp.json()
            rollout_id, key = created["id"], created["key"]
        except (aiohttp.ClientError, KeyError, ValueError, TimeoutError) as e:
            tally.rollout_errors += 1
            tally.last_error = f"create: {e!r}"
            await asyncio.sleep(1)
            continue
        url = f"{proxy}/r/{key}/v1/chat/completions"
        for _ in range(per_rollout):
            if stop.is_set():
                break
            n += 1
            stream = (index + n) % 2 == 0
            try:
                async with session.post(
                    url,
                    data=pb.body(stream, n),
                    headers={"Content-Type": "application/json"},
                    timeout=timeout,
                ) as resp:
                    data = await resp.read()
                    ok = answered(stream, resp.status, data)
                    if not ok:
                        tally.last_error = f"HTTP {resp.status}: {data[:200]!r}"
            except (aiohttp.ClientError, TimeoutError) as e:
                ok = False
                tally.last_error = repr(e)
            if ok:
                tally.ok += 1
            else:
                tally.errors += 1
        try:
            async with session.patch(
                f"{proxy}/admin/rollouts/{rollout_id}",
                json={"status": "finished", "reward": 1.0},
            ) as resp:
                await resp.read()
                if resp.status == 200:
                    tally.rollouts_finished += 1
                else:
                    tally.rollout_errors += 1
        except (aiohttp.ClientError, TimeoutError) as e:
            tally.rollout_errors += 1
            tally.last_error = f"finish: {e!r}"


@contextlib.asynccontextmanager
async def load(proxy: str, clients: int, per_rollout: int) -> AsyncIterator[Tally]:
    tally = Tally()
    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = [
            asyncio.create_task(client(session, proxy, i, per_rollout, stop, tally))
            for i in range(clients)
        ]
        try:
            yield tally
        finally:
            stop.set()
            await asyncio.gather(*tasks)


async def reference(upstream: str, args: argparse.Namespace, tmp: Path) -> float:
    """CPU per call of the bare capturing forwarder under the same mixed load."""
    port = pb.free_port()
    cmd = [sys.executable, str(ROOT / "bench" / "reference_forwarder.py")]
    cmd += ["--engine", upstream, "--port", str(port), "--capture"]
    with process(cmd, port, tmp / "forwarder.log") as pid:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        half = args.clients // 2
        cpu0 = tree_figures(pid)[0]
        done = await asyncio.gather(
            pb.drive(url, False, args.clients - half, args.reference_seconds, warmup=0),
            pb.drive(url, True, half, args.reference_seconds, warmup=0),
        )
        cpu = tree_figures(pid)[0] - cpu0
    return cpu / max(1, sum(len(r.latencies) for r in done))


@contextlib.asynccontextmanager
async def make_store(kind: str, tmp: Path, pg_admin: str) -> AsyncIterator[Store]:
    if kind == "sqlite":
        file = tmp / "soak.sqlite"
        yield Store(f"sqlite:///{file}", file=file)
        return
    import asyncpg

    name = f"rolltap_soak_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(pg_admin, timeout=5)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    host = pg_admin.split("://", 1)[1].rsplit("/", 1)[0]
    store = Store(f"postgresql+asyncpg://{host}/{name}", pg_dsn=f"postgresql://{host}/{name}")
    try:
        migrate = [sys.executable, "-m", "rolltap.cli.main", "db", "upgrade", "--db", store.url]
        subprocess.run(migrate, cwd=ROOT, check=True, capture_output=True)
        yield store
    finally:
        conn = await asyncpg.connect(pg_admin)
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.close()


def trend(samples: list[Sample], name: str, window: int) -> tuple[float, float] | None:
    """(least-squares change over the last `window` samples against their mean, the mean)."""
    tail = samples[-window:]
    values = [float(getattr(s, name)) for s in tail]
    xs = [s.minute for s in tail]
    if len(values) < 3:
        return None
    mx, my = sum(xs) / len(xs), sum(values) / len(values)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, values, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    change = slope * (xs[-1] - xs[0])
    return (change / my if my else 0.0), my


def flatness(samples: list[Sample], name: str, window: int) -> str:
    found = trend(samples, name, window)
    if found is None:
        return "too few samples"
    relative, mean = found
    tolerance = TOLERANCE[name]
    verdict = "flat" if abs(relative) <= tolerance else "NOT FLAT"
    return (
        f"{verdict}: {relative:+.1%} over the window (mean {mean:.4g}, tolerance {tolerance:.0%})"
    )


async def soak(args: argparse.Namespace, tmp: Path) -> int:
    print(
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {args.clients} clients, "
        f"{args.calls_per_rollout} calls per rollout (streamed and not in turn), "
        f"{args.minutes:g} min into {args.store}"
    )
    engine_port = pb.free_port()
    engine_cmd = [sys.executable, "-m", "tests.support.fake_vllm", "--port", str(engine_port)]
    engine_cmd += ["--reply-tokens", str(pb.ANSWER_TOKENS)]
    with process(engine_cmd, engine_port, tmp / "engine.log"):
        upstream = f"http://127.0.0.1:{engine_port}"
        if args.reference_seconds > 0:
            per_call = await reference(upstream, args, tmp)
            print(
                f"bare capturing forwarder, same mixed load, {args.reference_seconds:g} s: "
                f"{per_call * 1e3:.2f} ms CPU per call"
            )
        async with make_store(args.store, tmp, args.pg_admin) as store:
            port = pb.free_port()
            serve = [sys.executable, "-m", "rolltap.cli.main", "serve", "--backend", upstream]
            serve += ["--db", store.url, "--port", str(port), "--workers", "1"]
            with process(serve, port, tmp / "proxy.log") as pid:
                proxy = f"http://127.0.0.1:{port}"
                samples, tally = await watch(proxy, pid, store, args)
            calls, finished = await stored_counts(store)
    return report(samples, tally, calls, finished, args)


async def watch(
    proxy: str, pid: int, store: Store, args: argparse.Namespace
) -> tuple[list[Sample], Tally]:
    samples: list[Sample] = []
    print(
        f"{'min':>5} {'calls':>8} {'calls/s':>8} {'lost':>5} {'RSS MB':>7} {'fds':>5} "
        f"{'CPU ms/call':>11} {'store MB':>9} {'B/call':>7} {'load':>5}"
    )
    _, rss_idle, fds_idle = tree_figures(pid)
    async with load(proxy, args.clients, args.calls_per_rollout) as tally:
        start = time.monotonic()
        cpu_before, _, _ = tree_figures(pid)
        ok_before = 0
        end = start + args.minutes * 60
        while time.monotonic() < end - 1e-3:
            await asyncio.sleep(min(args.interval, end - time.monotonic()))
            cpu, rss, fds = tree_figures(pid)
            size = await store_size(store)
            done = tally.ok - ok_before
            elapsed = time.monotonic() - start
            sample = Sample(
                minute=elapsed / 60,
                calls=done,
                rss_mb=rss,
                fds=fds,
                cpu_ms=(cpu - cpu_before) / max(1, done) * 1e3,
                store_bytes=size,
                bytes_per_call=size / max(1, tally.ok),
                load=os.getloadavg()[0],
            )
            samples.append(sample)
            print(
                f"{sample.minute:5.1f} {tally.ok:8d} {done / args.interval:8.0f} "
                f"{tally.errors:5d} {rss:7.1f} {fds:5d} {sample.cpu_ms:11.2f} "
                f"{size / 2**20:9.1f} {sample.bytes_per_call:7.0f} {sample.load:5.1f}"
            )
            cpu_before, ok_before = cpu, tally.ok
        print("stopping the load (calls in flight finish)...")
    # Descriptors follow the calls in flight; idle past the proxy's 30 s keep-alive to the
    # engine, a leak is what stays above the start beyond the store's connection pools.
    await asyncio.sleep(IDLE_SECONDS)
    _, rss_after, fds_after = tree_figures(pid)
    print(
        f"idle before the load: {fds_idle} descriptors, RSS {rss_idle:.1f} MB; "
        f"idle {IDLE_SECONDS:g} s after it: {fds_after} descriptors, RSS {rss_after:.1f} MB"
    )
    return samples, tally


def report(
    samples: list[Sample], tally: Tally, calls: int, finished: int, args: argparse.Namespace
) -> int:
    lost = max(0, tally.ok - calls)
    print(
        f"client successes {tally.ok}, client errors {tally.errors}, calls in the store {calls}: "
        f"{lost} lost ({calls - tally.ok} recorded beyond the successes)"
    )
    print(
        f"rollouts finished by the clients {tally.rollouts_finished}, stored as finished "
        f"{finished}; rollout create/finish errors {tally.rollout_errors}"
    )
    if tally.last_error:
        print(f"last client error: {tally.last_error}")
    window = max(1, round(args.window * 60 / args.interval))
    steady = [s for s in samples if s.minute > args.warmup]
    print(f"after the {args.warmup:g}-minute warm-up, over the last {args.window:g} minutes:")
    for name, label in (
        ("rss_mb", "proxy RSS"),
        ("fds", "open descriptors"),
        ("cpu_ms", "CPU per call"),
        ("calls", "calls per interval"),
        ("bytes_per_call", "store bytes per call"),
    ):
        print(f"  {label:<21} {flatness(steady, name, window)}")
    load = trend(steady, "load", window)
    if load is not None:
        # Not judged: other work on the machine moves calls per interval and CPU per call.
        print(f"  {'machine load':<21} {load[0]:+.1%} over the window (mean {load[1]:.1f})")
    failed = lost or tally.errors or finished != tally.rollouts_finished
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--calls-per-rollout", type=int, default=16)
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between lines")
    parser.add_argument("--warmup", type=float, default=5.0, help="minutes left out of the fit")
    parser.add_argument("--window", type=float, default=10.0, help="minutes the slope is fit on")
    parser.add_argument("--reference-seconds", type=float, default=30.0, help="0 skips it")
    parser.add_argument("--pg-admin", default=PG_ADMIN, help="where to create the database")
    parser.add_argument("--tmp", help="folder for the SQLite store and logs (default: a new one)")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    with contextlib.ExitStack() as stack:
        tmp = args.tmp or stack.enter_context(tempfile.TemporaryDirectory(prefix="rolltap-soak-"))
        sys.exit(asyncio.run(soak(args, Path(tmp))))


if __name__ == "__main__":
    main()
