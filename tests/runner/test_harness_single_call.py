"""single-call, the real adapter and its script, end to end against a scripted Chat Completions
server: one call with the instruction, the answer in answer.txt, errors as protocol errors."""

from __future__ import annotations

import json
from pathlib import Path

from rolltap.runner.harnesses import Ending
from rolltap.runner.harnesses.single_call import ANSWER_FILE, SingleCall
from tests.support.harness_process import KEY, assert_keyed, run_episode
from tests.support.scripted_llm import Fail, ScriptedLLM


async def test_one_call_and_the_answer_in_the_workdir(tmp_path: Path) -> None:
    llm = ScriptedLLM([], side_reply="Paris")
    run = await run_episode(SingleCall(), llm, tmp_path, instruction="Capital of France?")

    assert run.exit.returncode == 0, run.exit.stderr[-2000:]
    assert run.outcome.ending is Ending.FINISHED
    assert (run.workdir / ANSWER_FILE).read_text() == "Paris"
    assert_keyed(llm, "/v1/chat/completions")
    (call,) = llm.posts("/chat/completions")
    assert call.body["messages"] == [{"role": "user", "content": "Capital of France?"}]
    assert call.body["model"] == "scripted-model"
    assert "stream" not in call.body
    reply = json.loads(Path(run.launch.logs[0]).read_text())
    assert reply["choices"][0]["message"]["content"] == "Paris"
    assert KEY not in " ".join(run.launch.argv)


async def test_an_instruction_is_sent_as_written(tmp_path: Path) -> None:
    instruction = "--not a flag; $(echo no) `shell` 'quotes' \"and\" ünïcode\nline two"
    llm = ScriptedLLM([], side_reply="ok")
    run = await run_episode(SingleCall(), llm, tmp_path, instruction=instruction)

    assert run.outcome.ending is Ending.FINISHED, run.exit.stderr[-2000:]
    (call,) = llm.posts("/chat/completions")
    assert call.body["messages"][0]["content"] == instruction


async def test_an_http_error_is_a_protocol_error_without_the_key(tmp_path: Path) -> None:
    llm = ScriptedLLM([], side_failure=Fail(403, f"rollout finished (key {KEY})"))
    run = await run_episode(SingleCall(), llm, tmp_path)

    assert run.outcome.ending is Ending.PROTOCOL_ERROR, run.outcome
    assert "HTTP 403" in run.outcome.detail
    assert KEY not in run.outcome.detail
    assert not (run.workdir / ANSWER_FILE).exists()
