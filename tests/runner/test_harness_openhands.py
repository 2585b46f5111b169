"""OpenHands' V1 CLI, the real program, end to end against a scripted Chat Completions server."""

from __future__ import annotations

from pathlib import Path

import pytest

from rolltap.runner.harnesses import Ending
from rolltap.runner.harnesses.openhands import OpenHands
from tests.support.harness_process import KEY, assert_keyed, installed, run_episode
from tests.support.scripted_llm import Call, Fail, ScriptedLLM

pytestmark = pytest.mark.slow

WRITE = Call(
    "terminal",
    {
        "command": "echo hi > hello.txt; command -v python3 > python.txt",
        "security_risk": "LOW",
        "summary": "write",
    },
)
FINISH = Call("finish", {"message": "Done.", "summary": "done"})


async def test_episode_runs_through_the_keyed_path(tmp_path: Path) -> None:
    llm = ScriptedLLM([WRITE, FINISH])
    run = await run_episode(OpenHands(), llm, tmp_path)

    assert run.exit.returncode == 0, run.exit.stderr[-2000:]
    assert run.outcome.ending is Ending.FINISHED, run.outcome
    assert (run.workdir / "hello.txt").read_text() == "hi\n"
    # The agent's commands find the task's python, not the harness's venv.
    assert str(installed(OpenHands()).prefix) not in (run.workdir / "python.txt").read_text()
    assert_keyed(llm, "/v1/chat/completions")
    calls = llm.posts("/chat/completions")
    assert len(calls) == 2
    assert all(not c.body.get("stream") and c.body["model"] == "scripted-model" for c in calls)
    assert list(Path(run.launch.logs[1]).rglob("event-*.json"))
    assert KEY not in " ".join(run.launch.argv)


async def test_an_http_error_is_reported_as_a_protocol_error(tmp_path: Path) -> None:
    llm = ScriptedLLM([Fail(404, "no such model")])
    run = await run_episode(OpenHands(), llm, tmp_path)

    assert run.outcome.ending is Ending.PROTOCOL_ERROR, run.outcome
    assert KEY not in run.outcome.detail
