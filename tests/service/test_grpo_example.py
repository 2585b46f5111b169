"""examples/grpo_cpu.py, two iterations for real: SmolLM2 on CPU behind `rolltap serve --runner`,
the trainer's copy learning from the groups, its weights pushed to the engine between batches.

Checked against the example's own store, not only its report: the engine's version changed,
the second batch's calls carry it, the engine's recorded logprobs match the trainer's
recomputation (same weights, float32) within the example's tolerance, and the engine answers a
fixed prompt with other logprobs once the trained weights are in.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rolltap.store import CallStatus, Store

pytestmark = [pytest.mark.slow, pytest.mark.model]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_cpu.py"


@pytest.mark.timeout(1200)
async def test_two_grpo_iterations_train_push_and_sample_on_the_new_weights(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--iterations", "2", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1100,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    first, second = report["iterations"]

    # The engine's version changed with each push, and the engine itself says so.
    assert [it["update"]["weight_version"] for it in (first, second)] == ["1", "2"]
    assert report["engine_weight_version"] == "2"
    assert [p["weight_version"] for p in report["probe"]] == ["0", "1", "2"]

    # Every call of each batch was sampled, and recorded, with the version in force then.
    store = await Store.connect(f"sqlite:///{tmp_path / 'rolltap.sqlite'}")
    try:
        for iteration, version in ((first, "0"), (second, "1")):
            views = await store.rollouts(batch=iteration["batch_id"])
            assert len(views) == 16
            calls = [c for v in views for c in await store.calls(v.id)]
            assert calls
            assert {c.weight_version for c in calls} == {version}
            assert all(c.status is CallStatus.OK for c in calls)
            assert iteration["call_versions"] == [version]
    finally:
        await store.close()

    # Before the update, the trainer's recomputed logprobs match what the engine recorded.
    gap = first["mismatch"]
    assert gap["tokens"] > 50
    assert gap["max_abs"] <= report["tolerance"]
    assert second["mismatch"]["max_abs"] <= report["tolerance"], (
        "the pushed weights are the ones trained"
    )
    # A gradient step happened (some group had different rewards) ...
    assert first["informative"] > 0
    assert first["grad_norm"] > 0
    # ... and the engine's logprobs for a fixed prompt moved once its weights were replaced.
    before, after = report["probe"][0], report["probe"][1]
    if before["token_ids"] == after["token_ids"]:
        moved = max(abs(a - b) for a, b in zip(before["logprobs"], after["logprobs"], strict=True))
        assert moved > 10 * report["tolerance"]
