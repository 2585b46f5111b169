"""Claude Code, the real binary, end to end against a scripted Anthropic Messages SSE server."""

from __future__ import annotations

from pathlib import Path

import pytest

from rolltap.runner.harnesses import Ending
from rolltap.runner.harnesses.claude_code import ClaudeCode
from tests.support.harness_process import KEY, assert_keyed, run_episode
from tests.support.scripted_llm import Call, Fail, Say, ScriptedLLM

pytestmark = pytest.mark.slow

WRITE = Call("Bash", {"command": "echo hi > hello.txt", "description": "Write hello.txt"})


async def test_episode_runs_through_the_keyed_path(tmp_path: Path) -> None:
    llm = ScriptedLLM([WRITE, Say("Done.")])
    run = await run_episode(ClaudeCode(), llm, tmp_path)

    assert run.exit.returncode == 0, run.exit.stderr[-2000:]
    assert run.outcome.ending is Ending.FINISHED, run.outcome
    assert (run.workdir / "hello.txt").read_text() == "hi\n"
    assert_keyed(llm, "/v1/messages")
    calls = llm.posts("/v1/messages")
    assert all(c.body["stream"] is True and c.body["model"] == "scripted-model" for c in calls)
    assert all(c.query == "beta=true" for c in calls)
    # No /api/hello probe with non-essential traffic off.
    assert not [s for s in llm.seen if s.path.endswith("/api/hello")]
    system = " ".join(b.get("text", "") for b in calls[0].body["system"])
    assert "x-anthropic-billing-header" not in system
    assert list(Path(run.launch.logs[1]).rglob("*.jsonl"))
    assert KEY not in " ".join(run.launch.argv)


async def test_turn_limit_is_reported_as_a_limit(tmp_path: Path) -> None:
    llm = ScriptedLLM([Call("Bash", {"command": "echo again", "description": "Echo"})] * 5)
    run = await run_episode(ClaudeCode(), llm, tmp_path, max_steps=2)

    assert run.outcome.ending is Ending.LIMIT, run.outcome


async def test_an_http_error_is_reported_as_a_protocol_error(tmp_path: Path) -> None:
    llm = ScriptedLLM([Fail(404, "no such model")])
    run = await run_episode(ClaudeCode(), llm, tmp_path)

    assert run.outcome.ending is Ending.PROTOCOL_ERROR, run.outcome
    assert KEY not in run.outcome.detail
