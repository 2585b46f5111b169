"""`rolltap run --token-in`: the batch's rollouts choose token-in themselves, so the run's own
proxy (with the parsers the flags name) answers them token-in; the flags that only the run's
own proxy can honour are refused with a proxy that runs elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import rolltap
from tests.support.processes import free_port, reaped, start_fake_engine
from tests.support.stores import opened_store

TASKS = [{"id": "say", "instruction": "say hi", "test": "test -s answer.txt"}]


@pytest.mark.parametrize("flags", [(), ("--token-in", "--reasoning-parser", "qwen3")])
async def test_a_batch_runs_token_in_when_asked(tmp_path: Path, flags: tuple[str, ...]) -> None:
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    port = free_port()
    with reaped(start_fake_engine(tmp_path, port, tmp_path / "engine.log", token_delay_ms=0,
                                  reply_tokens=4)) as kids:  # fmt: skip
        await kids[0].ready("/health")
        ran = rolltap(
            tmp_path,
            *("run", "tasks.jsonl", "--harness", "single-call", "--sandbox", "local"),
            *("--backend", kids[0].url, "--db", "s.sqlite", "--batch", "b", *flags),
        )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    async with opened_store(f"sqlite:///{tmp_path / 's.sqlite'}") as store:
        (view,) = await store.rollouts(batch="b")
        calls = await store.calls(view.id)
    assert len(calls) == 1
    if flags:
        assert view.meta["token_in"] is True
        assert calls[0].bridge == "first_turn"  # a single call: it starts its conversation
    else:
        assert "token_in" not in view.meta
        assert calls[0].bridge is None


def test_parsers_are_refused_for_a_proxy_that_runs_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text(json.dumps(TASKS[0]) + "\n")
    (tmp_path / "proxy.sock").touch()
    ran = rolltap(
        tmp_path,
        *("run", "tasks.jsonl", "--proxy-socket", "proxy.sock", "--model", "m"),
        *("--token-in", "--tool-call-parser", "qwen3_coder", "--db", "s.sqlite"),
    )
    assert ran.returncode == 1
    assert ran.stderr.strip().splitlines() == [
        "Error: --proxy-socket: that proxy answers token-in calls with its own route and parsers "
        "(its `serve` flags); --token-in alone asks it to use token-in for this batch"
    ]
    assert not (tmp_path / "s.sqlite").exists()  # refused before anything was created
