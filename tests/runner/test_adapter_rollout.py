"""mini-swe-agent, unmodified, on the built-in engine with rolltap's adapter (engine/adapter.py):
its first answer is a bash tool call the harness accepts, so the rollout's token chain stays one
segment, on a task no training task is (examples/tasks/hello-file)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rolltap.engine.launch import ANSWER_LIMITS, EngineProcess
from rolltap.store import RolloutStatus, Store
from tests.support.mini_swe_agent import hello_file_rollout

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
