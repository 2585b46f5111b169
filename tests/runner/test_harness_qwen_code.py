"""Qwen Code, the real binary, end to end against a scripted streaming Chat Completions server."""

from __future__ import annotations

from pathlib import Path

import pytest

from rolltap.runner.harnesses import Ending
from rolltap.runner.harnesses.qwen_code import QwenCode
from tests.support.harness_process import KEY, assert_keyed, run_episode
from tests.support.scripted_llm import Call, Fail, Say, ScriptedLLM

pytestmark = pytest.mark.slow

WRITE = Call("run_shell_command", {"command": "echo hi > hello.txt", "description": "Write"})


async def test_episode_runs_through_the_keyed_path(tmp_path: Path) -> None:
    llm = ScriptedLLM([WRITE, Say("Done.")])
    run = await run_episode(QwenCode(), llm, tmp_path)

    assert run.exit.returncode == 0, run.exit.stderr[-2000:]
    assert run.outcome.ending is Ending.FINISHED, run.outcome
    assert (run.workdir / "hello.txt").read_text() == "hi\n"
    assert_keyed(llm, "/v1/chat/completions")
    calls = llm.posts("/chat/completions")
    assert len(calls) == 2, "no memory-extraction side call after the episode"
    assert all(c.body["stream"] is True and c.body["model"] == "scripted-model" for c in calls)
    assert list(Path(run.launch.logs[1]).rglob("*.jsonl"))
    assert KEY not in " ".join(run.launch.argv)


async def test_turn_limit_is_reported_as_a_limit(tmp_path: Path) -> None:
    llm = ScriptedLLM([Call("run_shell_command", {"command": "echo again"})] * 5)
    run = await run_episode(QwenCode(), llm, tmp_path, max_steps=2)

    assert run.outcome.ending is Ending.LIMIT, run.outcome


async def test_an_http_error_is_reported_as_a_protocol_error(tmp_path: Path) -> None:
    llm = ScriptedLLM([Fail(404, "no such model")])
    run = await run_episode(QwenCode(), llm, tmp_path)

    assert run.outcome.ending is Ending.PROTOCOL_ERROR, run.outcome
    assert KEY not in run.outcome.detail
