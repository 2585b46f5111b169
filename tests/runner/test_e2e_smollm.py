"""mini-swe-agent, unmodified, on the real SmolLM2 built-in engine through the proxy, in local,
bwrap and docker sandboxes: the small model rarely solves a task, but every rollout must finish
with its calls recorded with token ids and a reward from the task's real test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rolltap.analysis import outcomes as outcome_counts
from rolltap.engine.launch import EngineProcess
from rolltap.store import Capture, RolloutStatus, Store
from tests.support.mini_swe_agent import hello_file_rollout

pytestmark = [pytest.mark.slow, pytest.mark.model]


@pytest.fixture(scope="module")
def bounded_engine() -> Iterator[EngineProcess]:
    """The built-in engine with each answer bounded: a 135M model on a CPU can ramble."""
    with EngineProcess.start(extra_args=["--default-max-tokens", "96"]) as engine:
        yield engine


@pytest.mark.parametrize("kind", ["local", "bwrap", "docker"])
async def test_mini_swe_agent_on_smollm(
    kind: str, bounded_engine: EngineProcess, store: Store, tmp_path: Path
) -> None:
    r = await hello_file_rollout(
        bounded_engine.url,
        store,
        tmp_path,
        sandbox=kind,
        max_steps=2,
        max_calls=6,
        timeout=240,
    )
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


async def test_mini_swe_agent_token_in(
    bounded_engine: EngineProcess, store: Store, tmp_path: Path
) -> None:
    """The same real harness with its rollout in token-in mode (`token_in` in the batch's meta):
    it finishes, every call is recorded with its token-in outcome, and the batch reports
    bridge_break_rate."""
    r = await hello_file_rollout(
        bounded_engine.url,
        store,
        tmp_path,
        max_steps=3,
        max_calls=6,
        timeout=240,
        meta={"token_in": True},
    )
    assert r.status in (RolloutStatus.SUCCEEDED, RolloutStatus.BUDGET_EXCEEDED), (
        r.error,
        r.logs_dir,
    )
    calls = await store.calls(r.rollout_id)
    assert calls, f"no call reached the proxy; see {r.logs_dir}"
    assert all(c.capture is Capture.TOKENS for c in calls if c.status.value == "ok")
    outcomes = [c.bridge for c in calls]
    assert outcomes[0] == "first_turn"
    # Every call went through token-in, and none broke a chain: SmolLM2's ChatML template is
    # append-only. mini-swe-agent drops answers it cannot use (no valid tool call, cut at the
    # token limit) before asking again: such a re-ask is the earlier request plus a new user
    # message, recorded as `answer_dropped` (a new chain, not a break), or bridged from the
    # last answer it kept. A small model rarely gets further. No later call looks new.
    assert set(outcomes) <= {"first_turn", "answer_dropped", "bridged"}, outcomes
    assert "first_turn" not in outcomes[1:], outcomes
    bridging = await outcome_counts.bridging(
        store, batch_id=(await store.rollout(r.rollout_id)).batch_id
    )
    assert bridging is not None
    assert bridging.outcomes == {o: outcomes.count(o) for o in set(outcomes)}
    reported = bridging.as_dict()
    assert reported["calls"] == len(calls)
    assert reported["bridge_break_rate"] in (None, 0.0)
