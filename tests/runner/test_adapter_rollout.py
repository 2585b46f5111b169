"""mini-swe-agent, unmodified, on the built-in engine with rolltap's adapter (engine/adapter.py):
its first answer is a bash tool call the harness accepts, so the rollout's token chain stays one
segment, on a task no training task is (examples/tasks/hello-file)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rolltap.cli.run import DEMO_TASKS
from rolltap.engine.launch import ANSWER_LIMITS, EngineProcess
from rolltap.runner.harnesses import NotInstalled, adapter, installation
from rolltap.store import RolloutStatus, Store
from tests.support.cli import ROLLTAP
from tests.support.mini_swe_agent import hello_file_rollout
from tests.support.stores import opened_store

pytestmark = [pytest.mark.slow, pytest.mark.model]


@pytest.fixture(scope="module")
def adapted_engine() -> Iterator[EngineProcess]:
    with EngineProcess.start(extra_args=(*ANSWER_LIMITS, "--adapter=default")) as engine:
        yield engine


async def test_mini_swe_agent_on_the_adapter_is_one_segment(
    adapted_engine: EngineProcess, store: Store, tmp_path: Path
) -> None:
    r = await hello_file_rollout(
        adapted_engine.url,
        store,
        tmp_path,
        max_steps=3,
        max_calls=4,
        timeout=120,
        meta={"sampling": {"temperature": 0}},
    )
    assert r.status is RolloutStatus.SUCCEEDED, (r.error, r.logs_dir)
    calls = await store.calls(r.rollout_id)
    assert calls, f"no call reached the proxy; see {r.logs_dir}"
    assert calls[0].tool_parse == "ok", calls[0]
    trajectory = json.loads((r.logs_dir / "agent" / "mini-swe-agent.traj.json").read_text())
    refused = [
        m
        for m in trajectory["messages"]
        if (m.get("extra") or {}).get("interrupt_type") == "FormatError"
    ]
    assert refused == [], refused
    assert any(m.get("tool_calls") for m in trajectory["messages"] if m["role"] == "assistant")
    (analysis,) = (await store.analyses([r.rollout_id])).values()
    assert analysis.segments == 1, analysis
    assert analysis.share >= 0.9, analysis


async def test_the_demo_solves_a_task_and_keeps_every_rollout_one_segment(tmp_path: Path) -> None:
    """`rolltap demo` as a new user runs it (its own engine with the default adapter, greedy):
    the README's promise of one unbroken token chain per rollout and a solved task."""
    try:
        installation(adapter("mini-swe-agent"))
    except NotInstalled:
        pytest.skip("mini-swe-agent is not installed: run `rolltap harness install mini-swe-agent`")
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    env = {k: v for k, v in os.environ.items() if k != "ROLLTAP_DB"}
    done = subprocess.run(
        [ROLLTAP, "demo", "--db", url], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stderr
    async with opened_store(url, read_only=True) as store:
        rollouts = await store.rollouts()
        analyses = await store.analyses([r.id for r in rollouts])
    assert sorted(r.task_id for r in rollouts) == sorted(DEMO_TASKS), done.stdout
    assert all(r.status is RolloutStatus.SUCCEEDED for r in rollouts), done.stdout
    assert any((r.reward or 0) > 0 for r in rollouts), done.stdout
    assert {a.segments for a in analyses.values()} == {1}, analyses
    assert all(a.share == 1.0 for a in analyses.values()), analyses
