"""rolltap.trainers on groups delivered by the real service: the verl, SkyRL and slime shapes
carry exactly the service's arrays, aligned, with the group, the reward and the versions."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rolltap.client import Group
from rolltap.store import Store
from rolltap.trainers import to_skyrl, to_slime, to_verl
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import fake_engine
from tests.support.service import TWO_TURNS, running_service

# Two chained turns: one trajectory of answer, observation, answer.


async def _groups(store: Store, tmp_path: Path) -> list[Group]:
    tasks = [{"id": f"t{i}", "instruction": "x", "test": "grep -q yes answer.txt"} for i in (0, 1)]
    fake = FakeVLLM(script=lambda body: Reply(text="yes"))
    async with (
        fake_engine(fake) as engine,
        running_service(
            store,
            engine.url,
            logs=tmp_path / "logs",
            scripts={"two-turns": TWO_TURNS},
            weight_version="5",
        ) as service,
    ):
        batch = await service.client.submit(tasks, harness="two-turns", samples_per_task=2)
        return [g async for g in service.client.groups(batch.id)]


async def test_the_trainer_shapes_carry_the_service_arrays(store: Store, tmp_path: Path) -> None:
    groups = await _groups(store, tmp_path)
    trajectories = [t for g in groups for t in g.trajectories]
    assert len(trajectories) == 4

    verl = [row for g in groups for row in to_verl(g)]
    skyrl = to_skyrl(groups)
    slime = [row for g in groups for row in to_slime(g)]

    for t, v, s in zip(trajectories, verl, slime, strict=True):
        response = t.response_ids.tolist()
        assert v["prompt_ids"] == t.prompt_ids.tolist()
        assert v["response_ids"] == response
        assert v["response_mask"] == t.loss_mask.tolist()
        assert v["response_logprobs"] == t.logprobs.tolist()
        assert len(v["response_mask"]) == len(response) == len(v["response_logprobs"])
        assert v["reward_score"] == 1.0
        assert v["num_turns"] == 4
        assert v["extra_fields"]["rollout_id"] == t.rollout_id
        assert v["extra_fields"]["weight_versions"] == ["5", "5"]
        assert [turn["kind"] for turn in v["extra_fields"]["turns"]] == [
            "answer",
            "observation",
            "answer",
        ]
        assert s["tokens"] == t.prompt_ids.tolist() + response
        assert s["response_length"] == len(response) == len(s["loss_mask"])
        assert s["rollout_log_probs"] == t.logprobs.tolist()
        assert s["status"] == "completed"
        assert s["weight_versions"] == ["5", "5"]
    assert {v["extra_fields"]["uid"] for v in verl} == {g.group_id for g in groups}
    assert [s["index"] for s in to_slime(groups[0], start_index=10)] == [10, 11]
    assert skyrl["prompt_token_ids"] == [v["prompt_ids"] for v in verl]
    assert skyrl["loss_masks"] == [v["response_mask"] for v in verl]
    assert skyrl["rollout_logprobs"] == [v["response_logprobs"] for v in verl]
    assert skyrl["rewards"] == [1.0] * 4
    assert skyrl["stop_reasons"] == ["stop"] * 4
    assert skyrl["trajectory_ids"] == [
        {"instance_id": g.task_id, "repetition_id": s.sample_index}
        for g in groups
        for s in g.samples
    ]
    assert skyrl["rollout_metrics"]["weight_versions"] == ["5"]
    masks = [np.asarray(m) for m in skyrl["loss_masks"]]
    assert all(m.sum() > 0 and (m == 0).any() for m in masks), "answers and an observation"
    assert to_verl(groups[0], roles=("side",)) == []
