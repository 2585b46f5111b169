"""Real harness binaries in a real batch: runner + bwrap sandbox + proxy + a fake vLLM engine
that answers each harness with its own tool calls (so the episode is deterministic and the
reward comes out 1 from the task's real test), every call recorded with token ids. Run as root,
the sandbox is the unprivileged sandbox user's, and the harness is mounted from its mirror."""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rolltap.analysis import outcomes as outcome_counts
from rolltap.runner import run_batch
from rolltap.runner.harnesses import NotInstalled, adapter, installation
from rolltap.runner.rollout import RolloutResult
from rolltap.runner.tasks import load_tasks
from rolltap.store import Capture, RolloutStatus, Store
from tests.support.fake_vllm import IM_START, FakeVLLM, Reply, encode
from tests.support.proxy import fake_engine
from tests.support.sandboxes import provider_of
from tests.support.scripted_llm import Call, Say

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
WRITE = "echo hello > hello.txt"

EPISODES: dict[str, list[Call | Say]] = {
    "mini-swe-agent": [
        Call("bash", {"command": WRITE}),
        Call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
    ],
    "qwen-code": [
        Call("run_shell_command", {"command": WRITE, "description": "Write hello.txt"}),
        Say("Done."),
    ],
    "opencode": [Call("bash", {"command": WRITE, "description": "Write hello.txt"}), Say("Done.")],
    # Codex speaks Responses and Claude Code Messages: the proxy turns both into chat for the
    # engine, and back.
    "codex": [Call("exec_command", {"cmd": WRITE}), Say("Done.")],
    "claude-code": [
        Call("Bash", {"command": WRITE, "description": "Write hello.txt"}),
        Say("Done."),
    ],
    "openhands": [
        Call("terminal", {"command": WRITE, "security_risk": "LOW", "summary": "write"}),
        Call("finish", {"message": "Done.", "summary": "done"}),
    ],
}


def agent_script(steps: list[Call | Say]) -> Callable[[dict[str, Any]], Reply]:
    """Step k once the conversation holds k tool results; side calls (no tools) get a title."""

    def script(body: dict[str, Any]) -> Reply:
        if not body.get("tools"):
            return Reply(text="Hello file")
        return _step(steps, sum(1 for m in body["messages"] if m.get("role") == "tool"))

    return script


def agent_completion(steps: list[Call | Say]) -> Callable[[list[int]], Reply]:
    """The same episode for token-in calls, whose request is a prompt of ids (the fake's own
    template): step k once the prompt holds k tool turns."""
    tool_turn = [IM_START, *encode("tool\n")]

    def script(prompt: list[int]) -> Reply:
        n = len(tool_turn)
        done = sum(1 for i in range(len(prompt)) if prompt[i : i + n] == tool_turn)
        return _step(steps, done)

    return script


def _step(steps: list[Call | Say], done: int) -> Reply:
    step = steps[min(done, len(steps) - 1)]
    if isinstance(step, Say):
        return Reply(text=step.text)
    return Reply(text="", tool_calls=[{"name": step.name, "arguments": json.dumps(step.arguments)}])


async def _episode(
    name: str, store: Store, tmp_path: Path, *, token_in: bool = False
) -> tuple[RolloutResult, str]:
    """One rollout of the harness's episode in bwrap on the fake engine: (result, batch id)."""
    harness = adapter(name)
    try:
        installed = installation(harness)
    except NotInstalled:
        pytest.skip(f"{name} is not installed: run `rolltap harness install {name}`")
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed: run .ci/setup-bwrap")
    hello = next(t for t in load_tasks(ROOT / "examples" / "tasks") if t.id == "hello-file")

    steps = EPISODES[name]
    fake = FakeVLLM(script=agent_script(steps), completion_script=agent_completion(steps))
    async with fake_engine(fake) as engine, provider_of("bwrap", tmp_path / "boxes") as provider:
        result = await run_batch(
            [hello],
            harness=harness,
            installed=installed,
            sandbox=provider,
            backends=[engine.url],
            model="fake-model",
            store=store,
            timeout=240,
            logs_root=tmp_path / "logs",
            meta={"token_in": token_in},
        )
    (r,) = result.results
    assert (r.status, r.reward) == (RolloutStatus.SUCCEEDED, 1.0), (r.error, r.logs_dir)
    return r, result.batch_id


@pytest.mark.parametrize("name", list(EPISODES))
async def test_real_harness_rollout_in_bwrap(name: str, store: Store, tmp_path: Path) -> None:
    r, _ = await _episode(name, store, tmp_path)
    calls = await store.calls(r.rollout_id)
    assert calls, "the harness never reached the proxy"
    assert all(c.capture is Capture.TOKENS for c in calls)
    assert all(c.bridge is None for c in calls)  # normal mode
    assert any(c.finish_reason == "tool_calls" for c in calls)
    # The harness's own log landed with the rollout.
    assert any((r.logs_dir / "agent").rglob("*")) or (r.logs_dir / "harness-stdout.txt").exists()


@pytest.mark.parametrize("name", list(EPISODES))
async def test_real_harness_rollout_in_token_in_mode(
    name: str, store: Store, tmp_path: Path
) -> None:
    """The same episodes with the rollout in token-in mode, through all three dialects: every turn
    after a tool result is bridged (the fake's template re-spells tool arguments, so a
    re-rendered prompt would differ from the ids sampled), none breaks, and each bridged
    prompt holds the previous prompt and every id the engine sampled for it."""
    r, batch_id = await _episode(name, store, tmp_path, token_in=True)
    calls = await store.calls(r.rollout_id)
    outcomes = [c.bridge for c in calls]
    assert "bridged" in outcomes, outcomes
    bridging = await outcome_counts.bridging(store, batch_id=batch_id)
    assert bridging is not None
    assert bridging.bridge_break_rate == 0.0, bridging.outcomes
    agent = [c for c in calls if c.bridge == "bridged" or c.finish_reason == "tool_calls"]
    for before, after in itertools.pairwise(agent):
        b, a = await store.call_tokens(before.id), await store.call_tokens(after.id)
        held = np.concatenate([b.prompt_ids, b.choices[0].token_ids])
        assert np.array_equal(a.prompt_ids[: len(held)], held), (before.bridge, after.bridge)
