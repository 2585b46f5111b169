"""mini-swe-agent, the real binary, end to end against a scripted Chat Completions server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rolltap.runner.harnesses import Ending
from rolltap.runner.harnesses.mini_swe_agent import MiniSweAgent
from tests.support.harness_process import KEY, assert_keyed, installed, run_episode
from tests.support.scripted_llm import Call, Fail, ScriptedLLM

pytestmark = pytest.mark.slow

SUBMIT = Call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})


async def test_episode_runs_through_the_keyed_path(tmp_path: Path) -> None:
    write = "echo hi > hello.txt; command -v python3 > python.txt"
    llm = ScriptedLLM([Call("bash", {"command": write}), SUBMIT])
    run = await run_episode(MiniSweAgent(), llm, tmp_path)

    assert run.exit.returncode == 0, run.exit.stderr[-2000:]
    assert run.outcome.ending is Ending.FINISHED, run.outcome
    assert (run.workdir / "hello.txt").read_text() == "hi\n"
    # The agent's commands find the task's python, not the harness's venv.
    assert str(installed(MiniSweAgent()).prefix) not in (run.workdir / "python.txt").read_text()
    assert_keyed(llm, "/v1/chat/completions")
    calls = llm.posts("/chat/completions")
    assert len(calls) == 2
    assert all(not c.body.get("stream") and c.body["model"] == "scripted-model" for c in calls)
    trajectory = json.loads(Path(run.launch.logs[0]).read_text())
    assert trajectory["info"]["exit_status"] == "Submitted"
    assert KEY not in " ".join(run.launch.argv)


async def test_step_limit_stops_the_agent(tmp_path: Path) -> None:
    llm = ScriptedLLM([Call("bash", {"command": "echo again"})] * 5)
    run = await run_episode(MiniSweAgent(), llm, tmp_path, max_steps=2)

    assert run.outcome.ending is Ending.LIMIT, run.outcome
    assert len(llm.posts("/chat/completions")) == 2


async def test_an_http_error_is_reported_as_a_protocol_error(tmp_path: Path) -> None:
    llm = ScriptedLLM([Fail(404, "no such model")])
    run = await run_episode(MiniSweAgent(), llm, tmp_path)

    assert run.outcome.ending is Ending.PROTOCOL_ERROR, run.outcome
    # litellm reports hosted_vllm's 404 as a BadRequestError; mini retries it, then gives up.
    assert "BadRequestError" in run.outcome.detail
    assert len(llm.posts("/chat/completions")) == 3
    assert KEY not in run.outcome.detail
