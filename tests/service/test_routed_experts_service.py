"""A batch with `capture_routed_experts`: every rollout asks its engine for routed experts, and
the group's trajectories (both wire encodings) and `to_slime` carry them aligned with the tokens;
a server whose engine cannot give them refuses the batch in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rolltap.analysis.reading import rollout_trajectories
from rolltap.proxy.upstream.routed import DENSE
from rolltap.runner.service import ServiceLimits, SpecError, parse_spec
from rolltap.store import Store
from rolltap.trainers import to_slime
from tests.support.fake_vllm import FakeVLLM, Reply, routed_experts
from tests.support.proxy import fake_engine
from tests.support.service import TWO_TURNS, running_service

MOE = (3, 2, 64)


@pytest.mark.parametrize("encoding", ["base64", "arrow"])
async def test_a_batch_captures_routing_into_its_groups_and_slime_samples(
    store: Store, tmp_path: Path, encoding: str
) -> None:
    fake = FakeVLLM(sglang=True, moe=MOE, script=lambda body: Reply(text="yes"))
    tasks = [{"id": "t0", "instruction": "x", "test": "grep -q yes answer.txt"}]
    async with (
        fake_engine(fake) as engine,
        running_service(
            store,
            f"sglang={engine.url}",
            logs=tmp_path / "logs",
            scripts={"two-turns": TWO_TURNS},
            encoding=encoding,
        ) as service,
    ):
        batch = await service.client.submit(
            tasks, harness="two-turns", samples_per_task=2, capture_routed_experts=True
        )
        groups = [g async for g in service.client.groups(batch.id)]

    assert all(body["return_routed_experts"] is True for _, _, body in fake.requests)
    (group,) = groups
    slime = to_slime(group)
    assert len(slime) == len(group.trajectories) == 2
    for t, sample in zip(group.trajectories, slime, strict=True):
        ids = [*t.prompt_ids.tolist(), *t.response_ids.tolist()]
        expected = routed_experts(ids, *MOE)
        # SGLang sends no layer/top-k split: rows of layers * top-k, one per token but the last.
        assert t.routed_experts is not None
        assert t.routed_experts.dtype == np.uint8
        assert np.array_equal(t.routed_experts, expected.reshape(len(ids) - 1, -1))
        assert sample["tokens"] == ids
        assert np.array_equal(sample["rollout_routed_experts"], t.routed_experts)
        stored = (await rollout_trajectories(store, t.rollout_id)).trajectories[0]
        assert stored.routed_experts is not None
        assert stored.routed_experts.tobytes() == t.routed_experts.tobytes()


def test_a_server_on_a_dense_engine_refuses_the_batch() -> None:
    task = {"id": "t", "instruction": "x", "test": "true"}
    body = {"tasks": [task], "harness": "h", "sandbox": "bwrap"}
    limits = ServiceLimits(routed_experts_refusal=DENSE)
    assert parse_spec(body, limits).capture_routed_experts is False
    with pytest.raises(SpecError) as refused:
        parse_spec({**body, "capture_routed_experts": True}, limits)
    assert (refused.value.message, refused.value.param) == (DENSE, "capture_routed_experts")
    with pytest.raises(SpecError, match="true or false"):
        parse_spec({**body, "capture_routed_experts": "yes"}, ServiceLimits())
