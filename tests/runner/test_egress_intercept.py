"""Intercept mode with the real harness binaries left on their default hosts: Codex talks to
https://api.openai.com and Claude Code to https://api.anthropic.com with keys of their own, and
their calls land in the rollout with token ids, the episode solving the task's real test.

The engine is the fake vLLM of test_harness_rollouts (a real server speaking vLLM's protocol,
token ids included): SmolLM2's 8k context cannot hold either harness's first prompt (Codex
sends ~10k tokens), and a longer one takes minutes on a CPU (README, Egress)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest

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
