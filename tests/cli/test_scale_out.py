"""The scale-out flags: `rolltap serve --workers 2` (two processes on one port, both serving,
every call recorded once, orders that would reach one worker only refused on SQLite), and what
`serve --runner-ray` and `run --ray` refuse in one line."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import psutil
import pytest
from click.testing import CliRunner

from rolltap.cli.main import cli
from tests.support.databases import PostgresServer
from tests.support.processes import free_port, start_serve
from tests.support.proxy import fake_engine
from tests.support.stores import opened_store

_CALLS = re.compile(r"^rolltap_calls_total\{[^}]*\} ([0-9.e+]+)$", re.M)
_REPLICA = re.compile(r'^rolltap_replica\{replica="([^"]+)"\} 1', re.M)


async def _fresh(method: str, url: str, **kwargs: object) -> tuple[int, str]:
    """One request on a connection of its own: the kernel picks the worker per connection."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.request(method, url, **kwargs) as resp,  # type: ignore[arg-type]
    ):
        return resp.status, await resp.text()


async def test_two_workers_share_the_port_and_record_every_call_once(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'store.sqlite'}"
    async with opened_store(db) as store:
        rollouts = [await store.create_rollout() for _ in range(4)]
        async with fake_engine() as engine:
            port = free_port()
            child = start_serve(tmp_path, port, db, engine.url, options=["--workers", "2"])
            try:
                await child.ready("/health")
                await _each_worker_metrics(child.url)  # both up, so both can take calls
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                answers = await asyncio.gather(
                    *(
                        _fresh("POST", f"{child.url}/r/{r.key}/v1/chat/completions", json=body)
                        for r in rollouts
                        for _ in range(10)
                    )
                )
                assert [status for status, _ in answers] == [200] * 40

                # Each worker counts its own calls; together they served all 40.
                served: dict[str, float] = {}
                for _ in range(100):
                    _, text = await _fresh("GET", f"{child.url}/metrics")
                    replica = _REPLICA.search(text)
                    assert replica is not None
                    served[replica.group(1)] = sum(float(n) for n in _CALLS.findall(text))
                    if len(served) == 2:
                        break
                assert len(served) == 2, "one worker answered every connection"
                assert all(n > 0 for n in served.values())
                assert sum(served.values()) == 40

                status, text = await _fresh("POST", f"{child.url}/admin/pause")
                assert status == 409
                assert "workers_without_replication" in text
            finally:
                workers = psutil.Process(child.popen.pid).children()
                child.stop()
            assert child.popen.returncode == 0, child.tail()
            assert not [w for w in workers if w.is_running() and w.status() != "zombie"]
            assert len(engine.fake.requests) == 40
        for created in rollouts:
            calls = await store.calls(created.id)
            assert sorted(c.seq for c in calls) == list(range(1, 11))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--workers", "2", "--port", "0"], "workers share one port: give --port"),
        (["--workers", "2", "--runner"], "the rollout service runs in one process"),
        (["--runner-ray", "auto"], "give --runner too"),
        (["--runner", "--runner-ray", "auto"], "give a PostgreSQL --db"),
    ],
)
def test_serve_refuses_what_it_cannot_share(
    tmp_path: Path, options: list[str], message: str
) -> None:
    db = f"sqlite:///{tmp_path / 'store.sqlite'}"
    args = ["serve", "--db", db, "--backend", "http://127.0.0.1:9", *options]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ([], "a Ray batch's nodes share its store: give a PostgreSQL database"),
        (["--egress", "allowlist", "-c", "8"], "-c/--concurrency, --egress: not for a Ray batch"),
    ],
)
def test_run_on_ray_refuses_in_one_line(tmp_path: Path, options: list[str], message: str) -> None:
    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"id": "a", "instruction": "hi", "test": "true"}\n')
    db = f"sqlite:///{tmp_path / 'store.sqlite'}"
    args = ["run", str(tasks), "--harness", "oracle", "--ray", "auto", "--db", db, *options]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "store.sqlite").exists()


@pytest.fixture
def pg_url(postgres: PostgresServer) -> Iterator[str]:
    name = postgres.fresh()
    try:
        yield postgres.url(name)
    finally:
        postgres.drop(name)


@pytest.mark.postgres
async def test_workers_on_postgresql_pause_and_resume_together(tmp_path: Path, pg_url: str) -> None:
    async with fake_engine() as engine:
        child = start_serve(tmp_path, free_port(), pg_url, engine.url, options=["--workers", "2"])
        try:
            await child.ready("/health")
            # Both workers answer (each joined the channel before it served anything).
            assert await _workers_paused(child.url) == {False}
            status, text = await _fresh("POST", f"{child.url}/admin/pause?wait=5")
            assert status == 200, text
            assert '"others":1,"held":1,"missing":[]' in text.replace(" ", "")
            assert await _workers_paused(child.url) == {True}
            await _fresh("POST", f"{child.url}/admin/resume", json={"weight_version": "2"})
            assert await _workers_paused(child.url) == {False}
        finally:
            child.stop()
        assert child.popen.returncode == 0, child.tail()


async def _workers_paused(url: str) -> set[bool]:
    """rolltap_paused as each of the two workers reports it (connections land where they may)."""
    paused = set()
    for text in (await _each_worker_metrics(url)).values():
        flag = re.search(r"^rolltap_paused (\S+)$", text, re.M)
        assert flag is not None
        paused.add(float(flag.group(1)) == 1.0)
    return paused


async def _each_worker_metrics(url: str) -> dict[str, str]:
    """Each of the two workers' /metrics, by replica. `ready("/health")` means one worker
    serves; the other may still be starting, so this asks until both have answered."""
    seen: dict[str, str] = {}
    for _ in range(400):
        _, text = await _fresh("GET", f"{url}/metrics")
        replica = _REPLICA.search(text)
        assert replica is not None
        seen[replica.group(1)] = text
        if len(seen) == 2:
            return seen
        await asyncio.sleep(0.05)
    raise AssertionError("one worker answered every connection")
