"""mini-swe-agent, unmodified, on the real SmolLM2 built-in engine through the proxy, in local,
bwrap and docker sandboxes: the small model rarely solves a task, but every rollout must finish
with its calls recorded with token ids and a reward from the task's real test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rolltap.engine.launch import EngineProcess
from rolltap.runner import run_batch
from rolltap.runner.harnesses import NotInstalled, adapter, installation
from rolltap.runner.tasks import load_tasks
from rolltap.store import Capture, RolloutStatus, Store
from rolltap.store.bridging import Bridging
from tests.support.sandboxes import provider_of

pytestmark = [pytest.mark.slow, pytest.mark.model]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bounded_engine() -> Iterator[EngineProcess]:
    """The built-in engine with each answer bounded: a 135M model on a CPU can ramble."""
    with EngineProcess.start(extra_args=["--default-max-tokens", "96"]) as engine:
        yield engine


@pytest.mark.parametrize("kind", ["local", "bwrap", "docker"])
async def test_mini_swe_agent_on_smollm(
    kind: str, bounded_engine: EngineProcess, store: Store, tmp_path: Path
) -> None:
    harness = adapter("mini-swe-agent")
    try:
        installed = installation(harness)
    except NotInstalled:
        pytest.skip("mini-swe-agent is not installed: run `rolltap harness install mini-swe-agent`")
    tasks = [t for t in load_tasks(ROOT / "examples" / "tasks") if t.id == "hello-file"]

    async with provider_of(kind, tmp_path / "boxes") as provider:
        result = await run_batch(
            tasks,
            harness=harness,
            installed=installed,
            sandbox=provider,
            backends=[bounded_engine.url],
            store=store,
            max_steps=2,
            max_calls=6,
            timeout=240,
            logs_root=tmp_path / "logs",
        )

    (r,) = result.results
    assert r.status in (RolloutStatus.SUCCEEDED, RolloutStatus.BUDGET_EXCEEDED), (
        r.error,
        r.logs_dir,
    )
    assert r.reward in (0.0, 1.0)
    calls = await store.calls(r.rollout_id)
    assert calls, f"no call reached the proxy; see {r.logs_dir}"
    assert all(c.capture is Capture.TOKENS for c in calls if c.status.value == "ok")
    tokens = await store.call_tokens(calls[0].id)
    assert len(tokens.prompt_ids) > 100
    assert len(tokens.choices[0].token_ids) > 0
    view = await store.rollout(r.rollout_id)
    assert view.reward_details is not None
    assert "test_exit_code" in view.reward_details


async def _token_in_rollout(
    name: str,
    engine: EngineProcess,
    store: Store,
    tmp_path: Path,
    sandbox: str,
    max_calls: int,
    sampling: dict[str, object] | None = None,
) -> tuple[list[str | None], Bridging]:
    """Run the real harness `name` on hello-file with its rollout token-in (`token_in` in the
    batch's meta); check it finished with every call recorded with ids and a token-in outcome
    and that the batch reports them; the outcomes, in order, and the batch's report. `sampling`:
    options the batch imposes on every call (proxy/sampling.py)."""
    harness = adapter(name)
    try:
        installed = installation(harness)
    except NotInstalled:
        pytest.skip(f"{name} is not installed: run `rolltap harness install {name}`")
    tasks = [t for t in load_tasks(ROOT / "examples" / "tasks") if t.id == "hello-file"]

    async with provider_of(sandbox, tmp_path / "boxes") as provider:
        result = await run_batch(
            tasks,
            harness=harness,
            installed=installed,
            sandbox=provider,
            backends=[engine.url],
            store=store,
            max_steps=3,
            max_calls=max_calls,
            timeout=300,
            logs_root=tmp_path / "logs",
            meta={"token_in": True, **({"sampling": sampling} if sampling else {})},
        )

    (r,) = result.results
    assert r.status in (RolloutStatus.SUCCEEDED, RolloutStatus.BUDGET_EXCEEDED), (
        r.error,
        r.logs_dir,
    )
    calls = await store.calls(r.rollout_id)
    assert calls, f"no call reached the proxy; see {r.logs_dir}"
    assert all(c.capture is Capture.TOKENS for c in calls if c.status.value == "ok")
    outcomes = [c.bridge for c in calls]
    assert None not in outcomes, outcomes  # every call was decided token-in
    assert outcomes[0] == "first_turn"
    bridging = await store.bridging(batch_id=result.batch_id)
    assert bridging is not None
    assert bridging.outcomes == {o: outcomes.count(o) for o in set(outcomes)}
    assert bridging.as_dict()["calls"] == len(calls)
    return outcomes, bridging


async def test_mini_swe_agent_token_in(
    bounded_engine: EngineProcess, store: Store, tmp_path: Path
) -> None:
    """The same real harness with its rollout in token-in mode: it finishes, every call is
    recorded with its token-in outcome, and the batch reports bridge_break_rate."""
    outcomes, bridging = await _token_in_rollout(
        "mini-swe-agent", bounded_engine, store, tmp_path, "local", max_calls=6
    )
    # None broke a chain: SmolLM2's ChatML template is append-only. mini-swe-agent drops
    # answers it cannot use (no valid tool call, cut at the token limit) before asking again:
    # such a re-ask is the earlier request plus a new user message, recorded as
    # `answer_dropped` (a new chain, not a break), or bridged from the last answer it kept. A
    # small model rarely gets further. No later call looks new.
    assert set(outcomes) <= {"first_turn", "answer_dropped", "bridged"}, outcomes
    assert "first_turn" not in outcomes[1:], outcomes
    assert bridging.bridge_break_rate in (None, 0.0)


@pytest.fixture(scope="module")
def long_engine() -> Iterator[EngineProcess]:
    """Bounded answers and a context past SmolLM2's trained 8K: Codex's instructions and tools
    alone are longer (the far positions degrade the text, not the plumbing under test)."""
    args = ["--default-max-tokens", "96", "--max-model-len", "32768"]
    with EngineProcess.start(extra_args=args) as engine:
        yield engine


async def test_codex_token_in(long_engine: EngineProcess, store: Store, tmp_path: Path) -> None:
    """Codex, the real binary, in bwrap, on the real SmolLM2 engine in token-in mode: its
    Responses calls are answered token-in (the Responses dialect over the engine's token-in
    route) and the rollout finishes, every call recorded. SmolLM2 rarely writes Codex a tool
    call, so the run usually ends after one answer (the Codex token-in test with a scripted
    engine, tests/runner/test_harness_rollouts.py, bridges every turn)."""
    # Greedy: Codex calls an answer cut at its token limit a failure, and a sampled answer of a
    # 135M model may ramble past it.
    greedy = {"temperature": 0}
    await _token_in_rollout("codex", long_engine, store, tmp_path, "bwrap", 4, greedy)
