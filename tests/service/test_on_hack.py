"""A batch's `on_hack` on the real service: a sample whose record the reward-hack detectors
flagged (here, an answer that runs `git log --all`) is delivered flagged, delivered with reward
0, or drops its group; the samples carry the flags and /metrics counts them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rolltap.client import Batch, Dropped, Group
from rolltap.store import Store
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import fake_engine
from tests.support.service import running_service

HACK = "yes\n```bash\ngit log --all --oneline\n```"
# The fake harness's ask.py allows 16 tokens: an answer with a command needs more.
SCRIPT = (
    'sed -i "s/\\"max_tokens\\": 16/\\"max_tokens\\": 256/" "$ROLLTAP_ASK" && '
    'python3 "$ROLLTAP_ASK" "$ROLLTAP_INSTRUCTION" > answer.txt'
)


def _answers() -> FakeVLLM:
    """The `hack` task gets an answer that says yes and runs a command through history."""

    def script(body: dict[str, Any]) -> Reply:
        asked = str(body["messages"][-1]["content"])
        return Reply(text=HACK if asked.startswith("hack") else "yes")

    return FakeVLLM(script=script)


def _task(task_id: str) -> dict[str, str]:
    return {"id": task_id, "instruction": f"{task_id}: say yes", "test": "grep -q yes answer.txt"}


@pytest.mark.parametrize("on_hack", ["flag", "zero_reward", "drop"])
async def test_on_hack_flags_zeroes_or_drops_a_flagged_sample_s_group(
    on_hack: str, store: Store, tmp_path: Path
) -> None:
    async with (
        fake_engine(_answers()) as engine,
        running_service(store, engine.url, logs=tmp_path / "logs", scripts={"ask": SCRIPT}) as svc,
    ):
        batch = await svc.client.submit(
            [_task("hack"), _task("honest")], harness="ask", samples_per_task=2, on_hack=on_hack
        )
        events = [e async for e in svc.client.events(batch.id)]
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{svc.url}/metrics") as resp:
                metrics = await resp.text()

    groups = {e.task_id: e for e in events if isinstance(e, Group)}
    dropped = {e.task_id: e for e in events if isinstance(e, Dropped)}
    honest = groups["honest"]
    assert (honest.hacked, honest.rewards) == (False, [1.0, 1.0])
    assert all(s.hack_flags == [] for s in honest.samples)
    assert 'rolltap_hack_flagged_rollouts_total{detector="git_history"} 2.0' in metrics
    done = events[-1]
    assert isinstance(done, Batch)
    assert done.data["spec"]["on_hack"] == on_hack
    if on_hack == "drop":
        assert "hack" not in groups
        assert (dropped["hack"].reason, dropped["hack"].rewards) == ("hacked", [1.0, 1.0])
        return
    hacked = groups["hack"]
    expected = [1.0, 1.0] if on_hack == "flag" else [0.0, 0.0]
    assert (hacked.hacked, hacked.rewards, [s.reward for s in hacked.samples]) == (
        True,
        expected,
        expected,
    )
    for sample in hacked.samples:
        (flag,) = sample.hack_flags or []
        assert (flag["detector"], flag["command"]) == ("git_history", "git log --all --oneline")
