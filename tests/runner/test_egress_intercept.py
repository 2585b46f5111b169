"""Intercept mode with the real harness binaries left on their default hosts: Codex talks to
https://api.openai.com and Claude Code to https://api.anthropic.com with keys of their own, and
their calls land in the rollout with token ids, the episode solving the task's real test.

The whole-episode tests use the fake vLLM of test_harness_rollouts (a real server speaking
vLLM's protocol, token ids included), which solves the task; both harnesses also run on the real
SmolLM2 engine, their prompts shortened to fit the model's 8k context (Codex's default first
prompt is ~10k tokens)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from rolltap.engine.launch import EngineProcess
from rolltap.runner import run_batch
from rolltap.runner.egress import EgressMode, EgressSettings
from rolltap.runner.harnesses import (
    Harness,
    HarnessExit,
    Installation,
    Launch,
    NotInstalled,
    Outcome,
    RunContext,
    adapter,
    installation,
)
from rolltap.runner.tasks import load_tasks
from rolltap.store import Capture, EgressVerdict, RolloutStatus, Store
from tests.proxy.test_harness_binaries import CLAUDE_SMALL, CODEX_SMALL, with_args
from tests.runner.test_harness_rollouts import EPISODES, agent_script
from tests.support.egress import require_gate
from tests.support.fake_vllm import FakeVLLM
from tests.support.proxy import fake_engine
from tests.support.sandboxes import provider_of

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
FOREIGN_KEY = "sk-not-a-rollout-key-0000"
"""What the harness sends as its API key: the gate replaces it with the rollout's."""


@dataclass(frozen=True)
class DefaultHost:
    """The real adapter's launch, minus every base URL: the harness uses its vendor's host."""

    inner: Harness
    native_codex: bool = False
    """Run Codex's static binary instead of its Node launcher (an image without node)."""

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def launch(self, ctx: RunContext, installation: Installation) -> Launch:
        launch = self.inner.launch(ctx, installation)
        # Only the gate knows the rollout's key: the harness holds one of its own.
        env = {k: v for k, v in launch.env.items() if v != ctx.key}
        files = dict(launch.files)
        if self.inner.name == "claude-code":
            del env["ANTHROPIC_BASE_URL"]
            env["ANTHROPIC_AUTH_TOKEN"] = FOREIGN_KEY
        else:
            # Codex's built-in openai provider, reading its key from CODEX_API_KEY.
            (config,) = (p for p in files if p.name == "config.toml")
            files[config] = "\n".join([f'model = "{ctx.model}"', *_features(files[config])])
            env["CODEX_API_KEY"] = FOREIGN_KEY
            if self.native_codex:
                prefix = Path(str(installation.prefix))
                (binary,) = prefix.glob("node_modules/@openai/codex-linux-*/vendor/*/bin/codex")
                launch = replace(launch, argv=(str(binary), *launch.argv[1:]))
        assert ctx.key not in str(env), "the rollout's key would reach the harness"
        return replace(launch, env=env, files=files)

    def classify(self, ctx: RunContext, exit: HarnessExit) -> Outcome:
        return self.inner.classify(ctx, exit)


def _features(config: str) -> list[str]:
    """The adapter's [features] and [analytics] tables, without its provider."""
    lines = config.splitlines()
    return lines[lines.index("[features]") :]


@pytest.mark.parametrize("kind", ["bwrap", "docker"])
@pytest.mark.parametrize("name", ["codex", "claude-code"])
async def test_a_harness_on_its_default_host_is_captured_into_the_rollout(
    name: str, kind: str, store: Store, tmp_path: Path
) -> None:
    require_gate()
    harness = adapter(name)
    try:
        installed = installation(harness)
    except NotInstalled:
        pytest.skip(f"{name} is not installed: run `rolltap harness install {name}`")
    hello = next(t for t in load_tasks(ROOT / "examples" / "tasks") if t.id == "hello-file")

    fake = FakeVLLM(script=agent_script(EPISODES[name]))
    async with fake_engine(fake) as engine, provider_of(kind, tmp_path / "boxes") as provider:
        result = await run_batch(
            [hello],
            harness=DefaultHost(harness, native_codex=kind == "docker"),  # type: ignore[arg-type]
            installed=installed,
            harness_from="host",
            sandbox=provider,
            backends=[engine.url],
            model="fake-model",
            store=store,
            timeout=240,
            logs_root=tmp_path / "logs",
            egress=EgressSettings(mode=EgressMode.INTERCEPT),
        )

    (r,) = result.results
    calls = await store.calls(r.rollout_id)
    assert (r.status, r.reward) == (RolloutStatus.SUCCEEDED, 1.0), (r.error, r.logs_dir)
    assert calls, f"nothing reached the rollout ({r.error}, logs {r.logs_dir})"
    assert all(c.capture is Capture.TOKENS for c in calls), [c.error for c in calls]
    tokens = await store.rollout_tokens(r.rollout_id)
    assert any(len(t.prompt_ids) > 0 and t.choices[0].token_ids.size for t in tokens.values())
    egress = await store.egress(r.rollout_id)
    host = "api.anthropic.com" if name == "claude-code" else "api.openai.com"
    intercepted = [e for e in egress if e.verdict is EgressVerdict.INTERCEPTED]
    assert intercepted, egress
    assert all(e.host == host for e in intercepted), egress
    assert any(e.status == 200 and e.response_bytes > 0 for e in intercepted), egress


@dataclass(frozen=True)
class Shortened:
    """A harness on its default host with its prompt cut to fit SmolLM2's 8k context, as
    tests/proxy/test_harness_binaries.py's SmolLM2 tests do (short instructions, few tools)."""

    inner: DefaultHost

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def launch(self, ctx: RunContext, installation: Installation) -> Launch:
        launch = self.inner.launch(ctx, installation)
        if self.inner.name == "claude-code":
            return with_args(launch, CLAUDE_SMALL)
        instructions = ctx.home / "instructions.md"
        files = {**launch.files, instructions: "You are a coding agent. Run shell commands.\n"}
        # CODEX_SMALL without its first option, which tunes a `rolltap` provider this launch
        # does not have (Codex uses its built-in openai provider here).
        extra = ("-c", f"model_instructions_file={instructions}", *CODEX_SMALL[2:])
        return with_args(replace(launch, files=files), extra)

    def classify(self, ctx: RunContext, exit: HarnessExit) -> Outcome:
        return self.inner.classify(ctx, exit)


@pytest.mark.parametrize(("name", "cap"), [("codex", 160), ("claude-code", 96)])
async def test_a_harness_on_its_default_host_is_captured_from_the_built_in_engine(
    name: str, cap: int, smollm_engine: EngineProcess, store: Store, tmp_path: Path
) -> None:
    """The same capture with the real SmolLM2 engine behind the proxy: the ids recorded are the
    ones the engine sampled for the harness's call to its vendor's host. The small model rarely
    solves the task; what matters is that its calls land in the rollout."""
    require_gate()
    harness = adapter(name)
    try:
        installed = installation(harness)
    except NotInstalled:
        pytest.skip(f"{name} is not installed: run `rolltap harness install {name}`")
    hello = next(t for t in load_tasks(ROOT / "examples" / "tasks") if t.id == "hello-file")

    async with provider_of("bwrap", tmp_path / "boxes") as provider:
        result = await run_batch(
            [hello],
            harness=Shortened(DefaultHost(harness)),  # type: ignore[arg-type]
            installed=installed,
            harness_from="host",
            sandbox=provider,
            backends=[smollm_engine.url],
            model=smollm_engine.model,
            store=store,
            max_steps=3,
            max_tokens_cap=cap,
            timeout=240,
            logs_root=tmp_path / "logs",
            egress=EgressSettings(mode=EgressMode.INTERCEPT),
        )

    (r,) = result.results
    calls = await store.calls(r.rollout_id)
    assert calls, f"nothing reached the rollout ({r.error}, logs {r.logs_dir})"
    answered = [c for c in calls if c.status.value == "ok"]
    assert answered, [(c.status, c.error) for c in calls]
    assert all(c.capture is Capture.TOKENS for c in answered)
    tokens = await store.call_tokens(answered[0].id)
    assert len(tokens.prompt_ids) > 100
    assert tokens.choices[0].token_ids.size > 0
    host = "api.anthropic.com" if name == "claude-code" else "api.openai.com"
    intercepted = [
        e for e in await store.egress(r.rollout_id) if e.verdict is EgressVerdict.INTERCEPTED
    ]
    assert intercepted
    assert all(e.host == host for e in intercepted)
