"""examples/grpo_cpu.py, two short iterations for real: SmolLM2 on CPU behind `rolltap serve
--runner`, the trainer's copy learning from the groups, its weights pushed to the engine between
batches, the held-out tasks evaluated before and after, the curve drawn.

Plumbing, not learning (the full run is a documented command, README "Train on it"): checked
against the example's own store, not only its report: the engine's version changed, each
batch's calls carry the version in force, the engine's recorded logprobs match the trainer's
recomputation (same weights, float32) within the example's tolerance, and the engine answers a
fixed prompt with other logprobs once the trained weights are in. The training tasks here are
the example's words with a coin-flip test (the answer's length is even), so that groups differ
and a gradient step happens whatever the base model says; the held-out ones are the example's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rolltap.examples import grpo_tasks
from rolltap.store import CallStatus
from tests.support.stores import opened_store

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "grpo_cpu.py"
TASKS, SAMPLES, HELDOUT, HELDOUT_SAMPLES = 4, 4, 4, 2


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.timeout(1200)
async def test_two_grpo_iterations_train_push_sample_on_the_new_weights_and_draw(
    tmp_path: Path,
) -> None:
    coin_flips = tmp_path / "train.jsonl"
    train, _ = grpo_tasks.split()
    coin_flips.write_text(
        "".join(
            json.dumps(
                {**grpo_tasks.task(word), "test": "[ $(( $(wc -c < answer.txt) % 2 )) = 0 ]"}
            )
            + "\n"
            for word in train[:TASKS]
        )
    )
    done = subprocess.run(
        [
            *(sys.executable, str(EXAMPLE), "--iterations", "2", "--seed", "1"),
            *("--tasks", str(TASKS), "--samples", str(SAMPLES), "--train-tasks", coin_flips),
            *("--heldout", str(HELDOUT), "--heldout-samples", str(HELDOUT_SAMPLES)),
            *("--out", tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=1100,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "run"
    report = json.loads((out / "report.json").read_text())
    first, second = report["iterations"]

    # The engine's version changed with each push, and the engine itself says so.
    assert [it["update"]["weight_version"] for it in (first, second)] == ["1", "2"]
    assert report["engine_weight_version"] == "2"
    assert [p["weight_version"] for p in report["probe"]] == ["0", "1", "2"]

    # Every call of each batch was sampled, and recorded, with the version in force then; the
    # held-out tasks ran on the base weights and on the last ones.
    heldout = report["heldout"]
    assert [h["policy_version"] for h in heldout] == ["0", "2"]
    async with opened_store(f"sqlite:///{out / 'rolltap.sqlite'}") as store:
        batches = [(first, "0", TASKS * SAMPLES), (second, "1", TASKS * SAMPLES)]
        batches += [(h, h["policy_version"], HELDOUT * HELDOUT_SAMPLES) for h in heldout]
        for batch, version, rollouts in batches:
            views = await store.rollouts(batch=batch["batch_id"])
            assert len(views) == rollouts
            calls = [c for v in views for c in await store.calls(v.id)]
            assert len(calls) == rollouts
            assert {c.weight_version for c in calls} == {version}
            assert all(c.status is CallStatus.OK for c in calls)
    assert [it["call_versions"] for it in (first, second)] == [["0"], ["1"]]
    assert all(h["samples"] == HELDOUT * HELDOUT_SAMPLES for h in heldout)
    assert all(0 <= h["mean_reward"] <= 1 for h in heldout)

    # Before each update, the trainer's recomputed logprobs match what the engine recorded.
    for it in (first, second):
        assert it["mismatch"]["tokens"] > 50
        assert it["mismatch"]["max_abs"] <= report["tolerance"]
    # A gradient step happened (some group had different rewards) ...
    assert first["informative"] > 0
    assert first["grad_norm"] > 0
    # ... and the engine's logprobs for a fixed prompt moved once its weights were replaced.
    before, after = report["probe"][0], report["probe"][1]
    if before["token_ids"] == after["token_ids"]:
        moved = max(abs(a - b) for a, b in zip(before["logprobs"], after["logprobs"], strict=True))
        assert moved > 10 * report["tolerance"]

    # Seconds, wall and CPU, per phase of every iteration and in all; the curve as a PNG.
    for it in (first, second):
        assert set(it["seconds"]) == set(it["cpu_seconds"]) == {"sample", "train", "update"}
        assert all(s >= 0 for s in [*it["seconds"].values(), *it["cpu_seconds"].values()])
    assert report["cpu_seconds"]["trainer"] > 0
    assert report["cpu_seconds"]["server"] > 0
    assert report["seconds"] > 0
    assert report["curve"] == str(out / "curve.png")
    # Only the last checkpoint stays (each is ~500 MB), and the run said so once, up front.
    assert sorted(p.name for p in out.glob("step-*")) == ["step-2"]
    assert (out / "step-2" / "model.safetensors").is_file()
    told = [line for line in done.stdout.splitlines() if line.startswith("checkpoints: ")]
    assert len(told) == 1, done.stdout
    assert told[0].startswith(f"checkpoints: {out}/step-N (")
    assert told[0].endswith("each replaces the one before (--keep-checkpoints keeps them all)")
    png = (out / "curve.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) < 200_000


def test_the_task_files_are_what_grpo_tasks_writes(tmp_path: Path) -> None:
    grpo_tasks.write(tmp_path)
    for name in ("grpo_train.jsonl", "grpo_heldout.jsonl"):
        assert (tmp_path / name).read_text() == (EXAMPLES / name).read_text()
    train, heldout = grpo_tasks.split()
    assert len(heldout) == grpo_tasks.HELDOUT
    assert not set(train) & set(heldout)
