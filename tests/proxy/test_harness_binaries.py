"""The real Codex CLI and Claude Code binaries through the proxy: on a scripted engine (a tool
call the harness must run, then an answer) and on the built-in SmolLM2 engine, on the task
examples/tasks/hello-file.

Each harness runs as a plain subprocess in a temp workdir from its adapter's Launch. The SmolLM2
runs shrink the harness's own prompt so a 135M model on CPU can take it (its context is 8,192
tokens; Codex's default prompt is ~10k tokens and Claude Code's ~12k): Codex gets a one-line
`model_instructions_file` and its optional tool families switched off, Claude Code a one-line
`--system-prompt` and only the Bash tool. The proxy caps generation (`max_tokens_cap`): SmolLM2
at temperature 1 often rambles to any limit. A capped answer is a `response.incomplete`, which
Codex retries, so its stream retries are raised; Claude Code continues capped answers itself.
The small model may fail the task; what must hold is that the run ends, every call is recorded
with token ids, and the harness reports no protocol error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from rolltap.analysis import outcomes as outcome_counts
from rolltap.engine.launch import EngineProcess
from rolltap.runner.harnesses import Ending, Harness, HarnessExit, Launch, Outcome, RunContext
from rolltap.runner.harnesses.claude_code import ClaudeCode
from rolltap.runner.harnesses.codex import Codex
from rolltap.store import CallDialect, CallStatus, CallView, Capture, Store
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.harness_process import installed, run_launch
from tests.support.proxy import fake_engine, new_rollout, running_proxy
from tests.support.stores import opened_store

pytestmark = pytest.mark.slow

TASK = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "hello-file"
INSTRUCTION = (TASK / "instruction.md").read_text().strip()


@dataclass(frozen=True)
class Run:
    ctx: RunContext
    exit: HarnessExit
    outcome: Outcome
    calls: list[CallView]
    chats: list[dict[str, Any]]
    """The chat requests the engine received (scripted engine only)."""


def with_args(launch: Launch, extra: Sequence[str]) -> Launch:
    """The launch with options added before the `--` that ends them."""
    argv = list(launch.argv)
    end = argv.index("--")
    return dataclasses.replace(launch, argv=(*argv[:end], *extra, *argv[end:]))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with opened_store(f"sqlite:///{tmp_path / 'store.sqlite'}") as opened:
        yield opened


async def run_harness(
    harness: Harness,
    store: Store,
    backend: str,
    model: str,
    tmp: Path,
    extra: Sequence[str] = (),
    cap: int | None = None,
    meta: dict[str, Any] | None = None,
) -> Run:
    installation = installed(harness)
    for sub in ("work", "home", "logs"):
        (tmp / sub).mkdir(exist_ok=True)
    async with running_proxy(store, backend, max_tokens_cap=cap) as proxy:
        rollout_id, key = await new_rollout(store, harness=harness.name, meta=meta or {})
        ctx = RunContext(
            instruction=INSTRUCTION,
            rollout_url=f"{proxy.url}/r/{key}",
            key=key,
            model=model,
            workdir=PurePosixPath(tmp / "work"),
            home=PurePosixPath(tmp / "home"),
            logs_dir=PurePosixPath(tmp / "logs"),
            max_steps=3,
        )
        exit = await run_launch(with_args(harness.launch(ctx, installation), extra), timeout=420)
    calls = await store.calls(rollout_id)
    return Run(ctx, exit, harness.classify(ctx, exit), calls, [])


async def assert_recorded_with_tokens(store: Store, run: Run, dialect: CallDialect) -> None:
    assert run.exit.returncode is not None, "the harness was killed"
    assert run.outcome.ending is not Ending.PROTOCOL_ERROR, run.outcome
    assert run.calls, run.exit.stderr[-2000:]
    for call in run.calls:
        assert call.dialect is dialect
        assert (call.status, call.capture) == (CallStatus.OK, Capture.TOKENS), call
        tokens = await store.call_tokens(call.id)
        assert len(tokens.prompt_ids) == call.prompt_tokens > 0
        assert len(tokens.choices[0].token_ids) == call.completion_tokens > 0


# -- scripted engine: the harness must run the tool call it is given ------------------------


def scripted(tool: str, arguments: str) -> FakeVLLM:
    def script(body: dict[str, Any]) -> Reply:
        if not body.get("tools"):
            return Reply(text="Hello file")  # a side call (title, summary)
        if any(m.get("role") == "tool" for m in body["messages"]):
            return Reply(text="Done.", reasoning="The file is there.")
        return Reply(
            text="Writing the file.",
            reasoning="One command does it.",
            tool_calls=[{"name": tool, "arguments": arguments}],
        )

    return FakeVLLM(script=script)


def assert_history_restored(fake: FakeVLLM) -> None:
    """The turn after the tool call carries the engine's own earlier message, as it wrote it."""
    chats = [b for p, _, b in fake.requests if p == "/v1/chat/completions" and b.get("tools")]
    first, second = chats[0], chats[-1]
    assistants = [m for m in second["messages"] if m["role"] == "assistant"]
    assert assistants[0]["reasoning"] == "One command does it."
    assert assistants[0]["content"] == "Writing the file."
    (call,) = assistants[0]["tool_calls"]
    tool_results = [m for m in second["messages"] if m["role"] == "tool"]
    assert tool_results[0]["tool_call_id"] == call["id"]
    assert len(second["messages"]) > len(first["messages"])


async def test_codex_runs_the_engines_tool_call(store: Store, tmp_path: Path) -> None:
    fake = scripted("exec_command", '{"cmd":  "echo hello > hello.txt"}')
    async with fake_engine(fake) as engine:
        run = await run_harness(Codex(), store, engine.url, "fake-model", tmp_path)

    assert run.outcome.ending is Ending.FINISHED, (run.outcome, run.exit.stderr[-2000:])
    assert (tmp_path / "work" / "hello.txt").read_text() == "hello\n"
    await assert_recorded_with_tokens(store, run, CallDialect.RESPONSES)
    assert len(run.calls) == 2
    assert_history_restored(fake)
    assert all(c.error is None for c in run.calls)
    second = [b for p, _, b in fake.requests if p == "/v1/chat/completions"][-1]
    assert second["messages"][-2]["tool_calls"][0]["function"]["arguments"] == (
        '{"cmd":  "echo hello > hello.txt"}'
    )


async def test_claude_code_runs_the_engines_tool_call(store: Store, tmp_path: Path) -> None:
    fake = scripted("Bash", '{"command":  "echo hello > hello.txt", "description": "write"}')
    async with fake_engine(fake) as engine:
        run = await run_harness(ClaudeCode(), store, engine.url, "fake-model", tmp_path)

    assert run.outcome.ending is Ending.FINISHED, (run.outcome, run.exit.stdout[-2000:])
    assert (tmp_path / "work" / "hello.txt").read_text() == "hello\n"
    await assert_recorded_with_tokens(store, run, CallDialect.MESSAGES)
    assert_history_restored(fake)
    main = [c for c in run.calls if c.purpose is None]
    assert len(main) == 2
    assert all(c.error is None for c in main)


# -- the built-in SmolLM2 engine ----------------------------------------------------------------

CODEX_SMALL = (
    "-c",
    "model_providers.rolltap.stream_max_retries=10",
    "--disable",
    "multi_agent",
    "--disable",
    "goals",
    "--disable",
    "skill_search",
    "--disable",
    "view_image",
    "--disable",
    "apps",
    "--disable",
    "plugins",
    "-c",
    "web_search=disabled",
)
CLAUDE_SMALL = (
    "--system-prompt",
    "You are a coding agent. Use the Bash tool to run shell commands.",
    "--tools",
    "Bash",
)


async def test_codex_on_smollm2(smollm_engine: EngineProcess, store: Store, tmp_path: Path) -> None:
    instructions = tmp_path / "instructions.md"
    instructions.write_text("You are a coding agent. Run shell commands with exec_command.\n")
    extra = ("-c", f"model_instructions_file={instructions}", *CODEX_SMALL)

    run = await run_harness(
        Codex(), store, smollm_engine.url, smollm_engine.model, tmp_path, extra, cap=160
    )

    await assert_recorded_with_tokens(store, run, CallDialect.RESPONSES)


async def test_codex_on_smollm2_token_in(
    smollm_engine: EngineProcess, store: Store, tmp_path: Path
) -> None:
    """Codex through the Responses API with its rollout in token-in mode: every call recorded
    with its ids and its token-in outcome (the first a first turn; none a break)."""
    instructions = tmp_path / "instructions.md"
    instructions.write_text("You are a coding agent. Run shell commands with exec_command.\n")
    extra = ("-c", f"model_instructions_file={instructions}", *CODEX_SMALL)

    run = await run_harness(
        Codex(),
        store,
        smollm_engine.url,
        smollm_engine.model,
        tmp_path,
        extra,
        cap=160,
        meta={"token_in": True},
    )

    await assert_recorded_with_tokens(store, run, CallDialect.RESPONSES)
    outcomes = [c.bridge for c in run.calls]
    assert outcomes[0] == "first_turn"
    assert set(outcomes) <= {"first_turn", "bridged"}, outcomes
    bridging = await outcome_counts.bridging(store, rollout_id=run.calls[0].rollout_id)
    assert bridging is not None
    assert bridging.as_dict()["calls"] == len(run.calls)


async def test_claude_code_on_smollm2(
    smollm_engine: EngineProcess, store: Store, tmp_path: Path
) -> None:
    run = await run_harness(
        ClaudeCode(),
        store,
        smollm_engine.url,
        smollm_engine.model,
        tmp_path,
        CLAUDE_SMALL,
        cap=96,
    )

    await assert_recorded_with_tokens(store, run, CallDialect.MESSAGES)
