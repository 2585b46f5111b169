"""`rolltap replay` end to end: real harnesses in real sandboxes, run once against an engine and
again against their own record, with no engine.

- mini-swe-agent on the built-in SmolLM2 engine replays with every call matched and the same
  reward;
- a task whose tool output is random (tests/runner/replay_tasks.jsonl: `./roll` prints a random
  number, which the harness sends back in its next request) diverges at that next call, with a
  diff naming both numbers; `--until-divergence` stops there and `--continue-live` asks an
  engine from there on;
- Codex (Responses) and Claude Code (Messages) sessions with a tool call replay too.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rolltap.audit.integrity import verify_rollout
from rolltap.audit.replay import REPLAY_OF, REPLAYS, Mode, Outcome, Served, replay_report
from rolltap.engine.launch import EngineProcess
from rolltap.runner import run_batch
from rolltap.runner.harnesses import Harness, Installation, NotInstalled, adapter, installation
from rolltap.runner.replay import Replayed, replay_rollout
from rolltap.runner.sandboxes.base import SandboxProvider
from rolltap.runner.tasks import Task, load_tasks
from rolltap.store import RolloutStatus, Store
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import fake_engine
from tests.support.sandboxes import provider_of
from tests.support.stores import opened_store

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
ROLL = Path(__file__).resolve().parent / "replay_tasks.jsonl"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def installed_or_skip(name: str) -> tuple[Harness, Installation]:
    harness = adapter(name)
    try:
        return harness, installation(harness)
    except NotInstalled:
        pytest.skip(f"{name} is not installed: run `rolltap harness install {name}`")


def task(path: Path, task_id: str) -> Task:
    return next(t for t in load_tasks(path) if t.id == task_id)


def steps(*commands: tuple[str, dict[str, Any]], done: str | None = None) -> FakeVLLM:
    """An engine that asks for tool call k once the conversation holds k tool results (then says
    `done`, if given); side calls (no tools) get a title."""

    def script(body: dict[str, Any]) -> Reply:
        if not body.get("tools"):
            return Reply(text="Roll a number")
        k = sum(1 for m in body["messages"] if m.get("role") == "tool")
        if k >= len(commands) and done is not None:
            return Reply(text=done)
        name, arguments = commands[min(k, len(commands) - 1)]
        return Reply(
            text="",
            reasoning=f"Step {k + 1}.",
            tool_calls=[{"name": name, "arguments": json.dumps(arguments)}],
        )

    return FakeVLLM(script=script)


async def record(
    store: Store,
    tmp_path: Path,
    name: str,
    the_task: Task,
    backend: str,
    model: str,
    kind: str = "bwrap",
    **settings: Any,
) -> str:
    harness, installed = installed_or_skip(name)
    async with provider_of(kind, tmp_path / "boxes") as provider:
        result = await run_batch(
            [the_task],
            harness=harness,
            installed=installed,
            sandbox=provider,
            backends=[backend],
            model=model,
            store=store,
            logs_root=tmp_path / "logs",
            **settings,
        )
    (r,) = result.results
    assert r.status is RolloutStatus.SUCCEEDED, (r.error, r.logs_dir)
    return r.rollout_id


async def replay(
    store: Store, tmp_path: Path, rollout_id: str, kind: str = "bwrap", **options: Any
) -> Replayed:
    provider: SandboxProvider
    async with provider_of(kind, tmp_path / "boxes") as provider:
        return await replay_rollout(
            rollout_id, store=store, sandbox=provider, logs_root=tmp_path / "replay-logs", **options
        )


def assert_every_call_matched(replayed: Replayed, n_calls: int) -> None:
    report = replayed.report
    outcomes = [(c.outcome, c.served) for c in report.calls]
    shown = json.dumps(report.to_json(), indent=1)
    assert outcomes == [(Outcome.MATCHED, Served.RECORDED)] * n_calls, shown
    assert report.reproduced, shown


# -- a real model -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bounded_engine() -> Iterator[EngineProcess]:
    """The built-in engine with each answer bounded: a 135M model on a CPU can ramble."""
    with EngineProcess.start(extra_args=["--default-max-tokens", "96"]) as engine:
        yield engine


@pytest.mark.model
async def test_mini_swe_agent_on_smollm_replays_every_call(
    bounded_engine: EngineProcess, store: Store, tmp_path: Path
) -> None:
    hello = task(ROOT / "examples" / "tasks", "hello-file")
    original = await record(
        store,
        tmp_path,
        "mini-swe-agent",
        hello,
        bounded_engine.url,
        bounded_engine.model,
        max_steps=2,
        max_calls=6,
        timeout=240,
    )
    recorded = await store.rollout(original)

    replayed = await replay(store, tmp_path, original)

    assert_every_call_matched(replayed, recorded.n_calls)
    assert replayed.report.replayed_reward == recorded.reward is not None
    replay_view = await store.rollout(replayed.report.replay)
    assert replay_view.meta[REPLAY_OF] == original
    assert (await store.rollout(original)).meta[REPLAYS] == [replay_view.id]
    assert replay_view.n_calls == recorded.n_calls
    assert (await verify_rollout(store, replay_view.id)).ok
    assert await replay_report(store, original) == replayed.report


# -- a task whose tool output is random ---------------------------------------------------------


def roller() -> FakeVLLM:
    return steps(("bash", {"command": "./roll | tee rolled.txt"}), ("bash", {"command": SUBMIT}))


@dataclass(frozen=True)
class Rolled:
    """A mini-swe-agent rollout of roll-a-number (./roll, then submit: 2 calls, reward 1),
    recorded once for the tests below, which replay it in their own ways."""

    db_url: str
    rollout_id: str
    tasks: Path
    """The task file it ran from (a copy the tests may change and restore)."""


@pytest.fixture(scope="module")
def rolled(tmp_path_factory: pytest.TempPathFactory) -> Rolled:
    root = tmp_path_factory.mktemp("rolled")
    tasks = root / "tasks.jsonl"
    tasks.write_text(ROLL.read_text())
    db_url = f"sqlite:///{root / 'store.sqlite'}"

    async def run_once() -> str:
        async with opened_store(db_url) as store, fake_engine(roller()) as engine:
            the_task = task(tasks, "roll-a-number")
            return await record(store, root, "mini-swe-agent", the_task, engine.url, "fake")

    return Rolled(db_url, asyncio.run(run_once()), tasks)


@pytest.fixture
async def rolled_store(rolled: Rolled) -> AsyncIterator[Store]:
    async with opened_store(rolled.db_url) as store:
        yield store


async def tool_output(store: Store, call_id: str) -> str:
    """The number the tool printed, as the request of `call_id` sends it back."""
    request = json.loads((await store.call_bodies(call_id)).request or b"{}")
    (number,) = re.findall(r"\b\d{4,}\b", request["messages"][-1]["content"])
    return str(number)


async def test_a_random_tool_output_diverges_at_the_next_call(
    rolled: Rolled, rolled_store: Store, tmp_path: Path
) -> None:
    store = rolled_store
    replayed = await replay(store, tmp_path, rolled.rollout_id)

    report = replayed.report
    assert [c.outcome for c in report.calls] == [Outcome.MATCHED, Outcome.DIVERGED], report
    first = report.first_divergence
    assert first is not None
    assert (first.position, first.recorded_seq, first.served) == (2, 2, Served.RECORDED)
    assert first.divergence is not None
    assert first.divergence.params == []
    (change,) = first.divergence.messages
    recorded_number = await tool_output(store, str(first.recorded_call))
    replayed_number = await tool_output(store, str(first.replay_call))
    assert recorded_number != replayed_number
    assert (change.kind, change.role) == ("changed", "tool")
    minus = [d for d in change.diff if d.startswith("-")]
    plus = [d for d in change.diff if d.startswith("+")]
    assert len(minus) == len(plus) == 1, change.diff
    assert recorded_number in minus[0]
    assert replayed_number in plus[0]
    assert (report.recorded_reward, report.replayed_reward) == (1.0, 1.0)
    assert not report.reproduced


async def test_until_divergence_stops_at_the_diverged_call(
    rolled: Rolled, rolled_store: Store, tmp_path: Path
) -> None:
    replayed = await replay(rolled_store, tmp_path, rolled.rollout_id, mode=Mode.UNTIL_DIVERGENCE)

    report = replayed.report
    made = [c for c in report.calls if c.outcome is not Outcome.MISSING]
    assert [(c.outcome, c.served) for c in made[:2]] == [
        (Outcome.MATCHED, Served.RECORDED),
        (Outcome.DIVERGED, Served.REFUSED),
    ]
    assert all(c.outcome is Outcome.STOPPED for c in made[2:])
    assert report.first_divergence is not None
    assert report.first_divergence.position == 2
    calls = await rolled_store.calls(report.replay)
    assert calls[1].http_status == 403
    assert "replay call 2 diverged" in (calls[1].error or "")


async def test_continue_live_asks_the_engine_from_the_divergence(
    rolled: Rolled, rolled_store: Store, tmp_path: Path
) -> None:
    live = roller()
    async with fake_engine(live) as engine:
        replayed = await replay(
            rolled_store,
            tmp_path,
            rolled.rollout_id,
            mode=Mode.CONTINUE_LIVE,
            backends=[engine.url],
        )

    report = replayed.report
    assert [(c.outcome, c.served) for c in report.calls] == [
        (Outcome.MATCHED, Served.RECORDED),
        (Outcome.DIVERGED, Served.LIVE),
    ]
    assert report.live_from == 2
    (asked,) = [b for p, _, b in live.requests if p == "/v1/chat/completions"]
    replayed_number = await tool_output(rolled_store, str(report.calls[1].replay_call))
    assert replayed_number in asked["messages"][-1]["content"]
    backends = [c.backend for c in await rolled_store.calls(report.replay)]
    assert backends == [f"cassette:{rolled.rollout_id}", engine.url]
    assert report.replayed_reward == 1.0


def test_the_cli_refuses_a_changed_task_and_prints_the_diff(rolled: Rolled) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "rolltap.cli.main", "replay", *args, "--db", rolled.db_url]
        return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)

    unchanged = rolled.tasks.read_text()
    rolled.tasks.write_text(unchanged.replace("Run ./roll", "Run ./roll now"))
    try:
        refused = cli(rolled.rollout_id)
        allowed = cli(rolled.rollout_id, "--allow-task-change")
    finally:
        rolled.tasks.write_text(unchanged)
    missing = cli("nope", "--json")

    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("Error: task roll-a-number changed since rollout")
    assert "--allow-task-change replays it anyway" in refused.stderr
    # The instruction is in the first request: the changed task diverges there, and says how.
    assert allowed.returncode == 1, allowed.stderr
    assert "diverged at call 1" in allowed.stdout
    assert "message 1 (user) changed" in allowed.stdout, allowed.stdout
    assert "+content: Please solve this issue: Run ./roll now once" in allowed.stdout
    assert "note: task roll-a-number changed since the rollout ran" in allowed.stdout
    assert (missing.returncode, missing.stderr.strip()) == (2, "Error: no rollout 'nope'")


# -- Codex (Responses) and Claude Code (Messages) ---------------------------------------------


SESSIONS: dict[str, Callable[[], FakeVLLM]] = {
    "codex": lambda: steps(("exec_command", {"cmd": "echo hello > hello.txt"}), done="Done."),
    "claude-code": lambda: steps(
        ("Bash", {"command": "echo hello > hello.txt", "description": "write"}), done="Done."
    ),
}


@pytest.mark.parametrize("name", list(SESSIONS))
async def test_codex_and_claude_code_sessions_replay(
    name: str, store: Store, tmp_path: Path
) -> None:
    hello = task(ROOT / "examples" / "tasks", "hello-file")
    async with fake_engine(SESSIONS[name]()) as engine:
        original = await record(
            store, tmp_path, name, hello, engine.url, "fake-model", kind="local", timeout=240
        )
    recorded = await store.rollout(original)

    replayed = await replay(store, tmp_path, original, kind="local")

    assert_every_call_matched(replayed, recorded.n_calls)
    assert replayed.report.replayed_reward == recorded.reward == 1.0
