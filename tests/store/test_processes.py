"""Several writer processes, and a writer killed mid-batch, leave a complete, consistent store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
from sqlalchemy import func, select, text

from rolltap.audit.integrity import verify_rollout
from rolltap.store import NewRollout, Store
from rolltap.store.models import call_table, choice_table
from tests.support.records import call
from tests.support.store_writer import tokens_for
from tests.support.stores import opened_store

ROOT = Path(__file__).resolve().parents[2]


def _writer(url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.store_writer", url, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _acks(output: str) -> dict[str, int]:
    acks = {}
    for line in output.splitlines():
        if line.startswith("ACK "):
            _, call_id, i = line.split()
            acks[call_id] = int(i)
    return acks


async def _assert_consistent(store: Store) -> None:
    """Every call has exactly its choices: no transaction was half applied."""
    async with store.db.connect() as conn:
        counted = (
            select(choice_table.c.call_id, func.count().label("n"))
            .group_by(choice_table.c.call_id)
            .subquery()
        )
        mismatched = await conn.scalar(
            select(func.count())
            .select_from(call_table.outerjoin(counted, counted.c.call_id == call_table.c.id))
            .where(func.coalesce(counted.c.n, 0) != call_table.c.n_choices)
        )
        assert mismatched == 0
        if conn.dialect.name == "sqlite":
            assert (await conn.execute(text("PRAGMA integrity_check"))).scalar() == "ok"


async def _assert_acked_calls_are_exact(store: Store, acks: dict[str, int], tag: int) -> None:
    for call_id, i in acks.items():
        prompt, completion, logprobs = tokens_for(tag, i)
        tokens = await store.call_tokens(call_id)
        np.testing.assert_array_equal(tokens.prompt_ids, prompt)
        np.testing.assert_array_equal(tokens.choices[0].token_ids, completion)
        assert tokens.choices[0].logprobs is not None
        np.testing.assert_array_equal(tokens.choices[0].logprobs, logprobs)


async def test_concurrent_writer_processes(db_url: str) -> None:
    async with opened_store(db_url) as store:
        shared = (await store.create_rollout(NewRollout(task_id="shared"))).id
        # Four processes: two with their own rollouts, two appending to one shared rollout.
        procs = [
            (tag, _writer(db_url, "--calls", "120", "--tag", str(tag), *extra))
            for tag, extra in [
                (1, []),
                (2, []),
                (3, ["--rollout", shared]),
                (4, ["--rollout", shared]),
            ]
        ]
        outputs = {}
        for tag, proc in procs:
            out, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err
            outputs[tag] = _acks(out)
            assert len(outputs[tag]) == 120

        for tag, acks in outputs.items():
            await _assert_acked_calls_are_exact(store, acks, tag)
        seqs = [c.seq for c in await store.calls(shared)]
        assert seqs == list(range(1, 241))
        # Two processes appended to it at once: still one unbroken hash chain.
        assert (await verify_rollout(store, shared)).ok
        await _assert_consistent(store)


async def test_writer_killed_mid_batch_keeps_every_acknowledged_call(db_url: str) -> None:
    proc = _writer(db_url, "--calls", "100000", "--parallel", "64", "--tag", "9")
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if sum(x.startswith("ACK ") for x in lines) >= 300:
            break
    os.kill(proc.pid, signal.SIGKILL)
    rest, _ = proc.communicate(timeout=60)
    acks = _acks("".join(lines) + rest)
    assert len(acks) >= 300
    assert "DONE" not in rest

    async with opened_store(db_url) as store:
        await _assert_acked_calls_are_exact(store, acks, 9)
        await _assert_consistent(store)
        # The store still accepts writes to the same rollout after the crash.
        rollout_id = next(line.split()[1] for line in lines if line.startswith("ROLLOUT"))
        calls = await store.calls(rollout_id)
        assert len(calls) >= len(acks)
        assert [c.seq for c in calls] == list(range(1, len(calls) + 1))
        await store.append_call(call(rollout_id, [1, 2], [3]))
        assert (await verify_rollout(store, rollout_id)).ok
