"""Codex CLI, the real binary, end to end against a scripted Responses SSE server."""

from __future__ import annotations

from pathlib import Path

import pytest

from rolltap.runner.harnesses import Ending
from rolltap.runner.harnesses.codex import Codex
from tests.support.harness_process import KEY, assert_keyed, run_episode
from tests.support.scripted_llm import Call, Fail, Say, ScriptedLLM

pytestmark = pytest.mark.slow


async def test_episode_runs_through_the_keyed_path(tmp_path: Path) -> None:
    llm = ScriptedLLM([Call("exec_command", {"cmd": "echo hi > hello.txt"}), Say("Done.")])
    run = await run_episode(Codex(), llm, tmp_path)

    assert run.exit.returncode == 0, run.exit.stderr[-2000:]
    assert run.outcome.ending is Ending.FINISHED, run.outcome
    assert (run.workdir / "hello.txt").read_text() == "hi\n"
    assert_keyed(llm, "/v1/responses")
    calls = llm.posts("/responses")
    assert len(calls) == 2
    assert all(c.body["stream"] is True and c.body["model"] == "scripted-model" for c in calls)
    assert not [s for s in llm.seen if s.headers.get("Upgrade")], "websocket upgrade attempted"
    sessions = Path(run.launch.logs[1])
    assert list(sessions.rglob("rollout-*.jsonl"))
    assert KEY not in " ".join(run.launch.argv)


async def test_an_http_error_is_reported_as_a_protocol_error(tmp_path: Path) -> None:
    llm = ScriptedLLM([Fail(404, "no such model")])
    run = await run_episode(Codex(), llm, tmp_path)

    assert run.outcome.ending is Ending.PROTOCOL_ERROR, run.outcome
    assert KEY not in run.outcome.detail
