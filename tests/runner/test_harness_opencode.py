"""OpenCode, the real binary, end to end against a scripted streaming Chat Completions server."""

from __future__ import annotations

from pathlib import Path

import pytest

from rolltap.runner.harnesses import Ending
from rolltap.runner.harnesses.opencode import OpenCode
from tests.support.harness_process import KEY, assert_keyed, run_episode
from tests.support.scripted_llm import Call, Fail, Say, ScriptedLLM

pytestmark = pytest.mark.slow

WRITE = Call("bash", {"command": "echo hi > hello.txt", "description": "Write hello.txt"})


async def test_episode_runs_through_the_keyed_path(tmp_path: Path) -> None:
    llm = ScriptedLLM([WRITE, Say("Done.")])
    run = await run_episode(OpenCode(), llm, tmp_path)

    assert run.exit.returncode == 0, run.exit.stderr[-2000:]
    assert run.outcome.ending is Ending.FINISHED, run.outcome
    assert (run.workdir / "hello.txt").read_text() == "hi\n"
    assert_keyed(llm, "/v1/chat/completions")
    calls = llm.posts("/chat/completions")
    assert all(c.body["stream"] is True and c.body["model"] == "scripted-model" for c in calls)
    # The session title is a side call without tools.
    assert [c for c in calls if not c.body.get("tools")]
    assert Path(run.launch.logs[1]).is_dir()
    assert KEY not in " ".join(run.launch.argv)


async def test_step_cap_asks_the_model_to_stop(tmp_path: Path) -> None:
    llm = ScriptedLLM([Call("bash", {"command": "echo again", "description": "Echo"})] * 3)
    run = await run_episode(OpenCode(), llm, tmp_path, max_steps=2)

    assert run.exit.returncode == 0, run.exit.stderr[-2000:]
    turns = [c.body["messages"] for c in llm.posts("/chat/completions") if c.body.get("tools")]
    # The cap is soft: from the second step on, each request ends with OpenCode's stop notice.
    assert "MAXIMUM STEPS REACHED" not in str(turns[0][-1])
    assert all("MAXIMUM STEPS REACHED" in str(t[-1]["content"]) for t in turns[1:])


async def test_an_http_error_is_reported_as_a_protocol_error(tmp_path: Path) -> None:
    llm = ScriptedLLM([Fail(404, "no such model")])
    run = await run_episode(OpenCode(), llm, tmp_path)

    assert run.outcome.ending is Ending.PROTOCOL_ERROR, run.outcome
    assert KEY not in run.outcome.detail
