"""Rollouts as Harbor's ATIF trajectory.json: agent sessions in all three dialects through the real
proxy, exported, checked field by field against ATIF-v1.8, and by Harbor's own validator where a
Python with Harbor is at hand (.ci/setup-harbor)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from rolltap.cli.main import cli
from rolltap.export.atif import SCHEMA_VERSION, rollout_atif
from rolltap.store import Store
from rolltap.store.events import Declared
from tests.support import atif_spec
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import fake_engine, new_rollout, running_proxy
from tests.support.stores import opened_store

LISTING = "a.txt\nb.txt"
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]
RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]
MESSAGES_TOOLS = [
    {
        "name": "shell",
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]


def _script(body: dict[str, Any]) -> Reply:
    if body["messages"][-1]["role"] == "tool":
        return Reply(text="all done")
    return Reply(
        text="I will list the files.",
        reasoning="Look first.",
        tool_calls=[{"name": "shell", "arguments": '{"cmd": "ls"}'}],
    )


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    async with session.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def _chat(session: aiohttp.ClientSession, base: str) -> None:
    url = f"{base}/v1/chat/completions"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "look around"},
    ]
    first = await _post(session, url, {"model": "m", "messages": messages, "tools": CHAT_TOOLS})
    said = first["choices"][0]["message"]
    call_id = said["tool_calls"][0]["id"]
    messages += [said, {"role": "tool", "tool_call_id": call_id, "content": LISTING}]
    await _post(session, url, {"model": "m", "messages": messages, "tools": CHAT_TOOLS})


async def _responses(session: aiohttp.ClientSession, base: str) -> None:
    url = f"{base}/v1/responses"
    items: list[dict[str, Any]] = [{"role": "user", "content": "look around"}]
    body = {"model": "m", "instructions": "You are terse.", "tools": RESPONSES_TOOLS}
    first = await _post(session, url, {**body, "input": items})
    call = next(i for i in first["output"] if i["type"] == "function_call")
    items += [*first["output"], {"type": "function_call_output", "call_id": call["call_id"]}]
    items[-1]["output"] = LISTING
    await _post(session, url, {**body, "input": items})


async def _messages(session: aiohttp.ClientSession, base: str) -> None:
    url = f"{base}/v1/messages"
    messages: list[dict[str, Any]] = [{"role": "user", "content": "look around"}]
    body = {"model": "m", "max_tokens": 500, "system": "You are terse.", "tools": MESSAGES_TOOLS}
    first = await _post(session, url, {**body, "messages": messages})
    use = next(b for b in first["content"] if b["type"] == "tool_use")
    messages += [
        {"role": "assistant", "content": first["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"]}]},
    ]
    messages[-1]["content"][0]["content"] = LISTING
    await _post(session, url, {**body, "messages": messages})


SESSIONS = {"chat": _chat, "responses": _responses, "messages": _messages}


async def _session(store: Store, dialect: str) -> str:
    async with (
        fake_engine(FakeVLLM(script=_script)) as engine,
        running_proxy(store, engine.url) as proxy,
        aiohttp.ClientSession() as session,
    ):
        rollout_id, key = await new_rollout(store, task_id=f"atif-{dialect}", harness="h")
        await SESSIONS[dialect](session, f"{proxy.url}/r/{key}")
    await store.report(rollout_id, Declared("finished"), reward=1.0)
    return rollout_id


@pytest.mark.parametrize("dialect", sorted(SESSIONS))
async def test_a_session_becomes_steps_with_the_engines_token_ids(
    store: Store, dialect: str
) -> None:
    rollout_id = await _session(store, dialect)

    doc = await rollout_atif(store, rollout_id)

    assert doc is not None
    atif_spec.check(doc)
    assert doc["schema_version"] == SCHEMA_VERSION == "ATIF-v1.8"
    assert (doc["session_id"], doc["agent"]["name"]) == (rollout_id, "h")
    steps = doc["steps"]
    assert [(s["source"], s["message"]) for s in steps] == [
        ("system", "You are terse."),
        ("user", "look around"),
        ("agent", "I will list the files."),
        ("agent", "all done"),
    ]
    acting = steps[2]
    (call,) = acting["tool_calls"]
    assert (call["function_name"], call["arguments"]) == ("shell", {"cmd": "ls"})
    assert acting["reasoning_content"] == "Look first."
    assert acting["observation"]["results"] == [
        {"source_call_id": call["tool_call_id"], "content": LISTING}
    ]
    calls = await store.calls(rollout_id)
    for step, recorded in zip(steps[2:], calls, strict=True):
        tokens = await store.call_tokens(recorded.id)
        metrics = step["metrics"]
        assert metrics["prompt_token_ids"] == tokens.prompt_ids.tolist()
        assert metrics["completion_token_ids"] == tokens.choices[0].token_ids.tolist()
        assert metrics["logprobs"] == tokens.choices[0].logprobs.tolist()
        assert metrics["completion_tokens"] == len(tokens.choices[0].token_ids)
        assert step["llm_call_count"] == 1
        assert step["extra"]["rolltap"]["call_id"] == recorded.id
        assert step["extra"]["rolltap"]["hash"] == recorded.hash
    rolltap = doc["extra"]["rolltap"]
    assert (rolltap["status"], rolltap["reward"]) == ("finished", 1.0)
    assert rolltap["head_hash"] == calls[-1].hash
    assert doc["final_metrics"]["total_steps"] == 4


async def test_refused_calls_side_calls_and_rewritten_history(store: Store) -> None:
    async with (
        fake_engine(FakeVLLM(script=_script)) as engine,
        running_proxy(store, engine.url) as proxy,
        aiohttp.ClientSession() as session,
    ):
        rollout_id, key = await new_rollout(store)
        url = f"{proxy.url}/r/{key}/v1/chat/completions"
        async with session.post(url, data=b"{broken") as refused:
            assert refused.status == 400
        async with session.post(
            url,
            json={"model": "m", "messages": [{"role": "user", "content": "name this chat"}]},
            headers={"x-rolltap-purpose": "title"},
        ) as titled:
            assert titled.status == 200
        await _chat(session, f"{proxy.url}/r/{key}")
        # The harness compacts: it drops the tool exchange and summarises it as a user turn.
        compacted = [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "summary: the files are a.txt and b.txt"},
        ]
        await _post(session, url, {"model": "m", "messages": compacted})

    doc = await rollout_atif(store, rollout_id)

    assert doc is not None
    atif_spec.check(doc)
    not_steps = doc["extra"]["rolltap"]["calls_not_steps"]
    assert [(n["seq"], n["reason"]) for n in not_steps] == [
        (1, "no answer (rejected)"),
        (2, "side call (title)"),
    ]
    last_user, last_agent = doc["steps"][-2:]
    assert last_user == {
        "source": "user",
        "message": "summary: the files are a.txt and b.txt",
        "timestamp": last_user["timestamp"],
        "step_id": len(doc["steps"]) - 1,
    }
    # It no longer sent the task, the tool exchange and the answer: four turns of five.
    assert last_agent["extra"]["rolltap"]["history_dropped"] == 4


def test_export_writes_a_directory_of_trajectories_or_one_file(
    tmp_path: Path, store_url_with_sessions: tuple[str, list[str]]
) -> None:
    url, ids = store_url_with_sessions
    runner = CliRunner()

    many = runner.invoke(
        cli, ["export", "--format", "atif", "--out", str(tmp_path / "d"), "--db", url]
    )
    one = runner.invoke(
        cli, ["export", "--rollout", ids[0], "--out", str(tmp_path / "one.json"), "--db", url]
    )
    wrong = runner.invoke(cli, ["export", "--out", str(tmp_path / "x.json"), "--db", url])

    assert many.exit_code == 0, many.output
    assert f"wrote 3 ATIF trajectories (12 steps) to {tmp_path / 'd'}" in many.output
    files = sorted((tmp_path / "d").glob("*/trajectory.json"))
    assert [f.parent.name for f in files] == sorted(ids)
    for f in files:
        atif_spec.check(json.loads(f.read_text()))
    assert one.exit_code == 0, one.output
    assert json.loads((tmp_path / "one.json").read_text())["session_id"] == ids[0]
    assert wrong.exit_code == 2
    assert "names one file, but 3 rollouts are selected" in wrong.output


def _harbor_python() -> str | None:
    configured = os.environ.get("ROLLTAP_HARBOR_PYTHON")
    default = Path.home() / ".cache" / "rolltap" / "harbor-venv" / "bin" / "python"
    for candidate in (configured, str(default)):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def test_harbors_own_validator_accepts_the_export(
    tmp_path: Path, store_url_with_sessions: tuple[str, list[str]]
) -> None:
    python = _harbor_python()
    if python is None:
        pytest.skip("no Python with Harbor's models: run .ci/setup-harbor")
    url, _ = store_url_with_sessions
    out = tmp_path / "atif"
    assert (
        CliRunner()
        .invoke(cli, ["export", "--format", "atif", "--out", str(out), "--db", url])
        .exit_code
        == 0
    )
    script = (
        "import sys; from harbor.utils.trajectory_validator import TrajectoryValidator\n"
        "bad = []\n"
        "for path in sys.argv[1:]:\n"
        "    v = TrajectoryValidator()\n"
        "    if not v.validate(path): bad.append((path, v.get_errors()))\n"
        "print(bad or 'ok')\n"
        "sys.exit(1 if bad else 0)\n"
    )
    paths = [str(p) for p in sorted(out.glob("*/trajectory.json"))]

    done = subprocess.run(
        [python, "-c", script, *paths], capture_output=True, text=True, check=False
    )

    assert len(paths) == 3
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def store_url_with_sessions(tmp_path: Path) -> tuple[str, list[str]]:
    """A SQLite store holding one recorded session per dialect."""
    import asyncio

    url = f"sqlite:///{tmp_path / 'sessions.sqlite'}"

    async def record() -> list[str]:
        async with opened_store(url) as store:
            return [await _session(store, d) for d in sorted(SESSIONS)]

    return url, asyncio.run(record())
