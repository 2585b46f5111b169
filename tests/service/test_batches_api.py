"""A batch through the HTTP API with the real client: the real proxy with the rollout service
mounted, a fake engine, the single-call harness in bwrap sandboxes, the tasks' real tests.
Groups arrive as they finish, both encodings carry what the store holds, submission is
idempotent, and bad requests get one clear error."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from rolltap.analysis.reading import trajectories
from rolltap.client import Batch, Dropped, Group, ServiceError
from rolltap.proxy.upstream.sampling import derived_seed
from rolltap.store import RolloutStatus, Store
from tests.support.fake_vllm import FakeVLLM, Reply, decode
from tests.support.proxy import fake_engine
from tests.support.service import running_service

TASKS = [
    {"id": "say-yes", "instruction": "Say yes.", "test": "grep -qi yes answer.txt"},
    {"id": "say-no", "instruction": "Say no.", "test": "grep -qi no answer.txt"},
]


def alternating() -> FakeVLLM:
    """Answers each task right, wrong, right... so every group of 2+ samples gets both rewards.
    The count is per task: one count across tasks let the scheduler's interleaving hand every
    right answer to the other task, leaving both groups all 0."""
    turns: dict[str, itertools.count[int]] = {}

    def answer(body: dict[str, Any]) -> Reply:
        asked = _last_user(body)
        wanted, other = ("yes", "no") if "yes" in asked.lower() else ("no", "yes")
        n = next(turns.setdefault(asked, itertools.count()))
        return Reply(text=other if n % 2 else wanted)

    return FakeVLLM(script=answer)


def _last_user(body: dict[str, Any]) -> str:
    return str(body["messages"][-1]["content"])


async def test_a_batch_through_the_api_delivers_every_group_with_its_trajectories(
    store: Store, tmp_path: Path
) -> None:
    async with (
        fake_engine(alternating()) as engine,
        running_service(store, engine.url, logs=tmp_path / "logs") as service,
    ):
        batch = await service.client.submit(
            TASKS,
            harness="single-call",
            samples_per_task=3,
            labels={"step": 4},
            policy_version="4",
            sampling={"temperature": 0.7, "max_tokens": 8, "seed": 11},
        )
        assert (batch.created, batch.status) == (True, "running")
        events = [e async for e in service.client.events(batch.id)]
        status = await service.client.batch(batch.id)

    groups = [e for e in events if isinstance(e, Group)]
    assert sorted(g.task_id for g in groups) == ["say-no", "say-yes"]
    assert isinstance(events[-1], Batch)
    assert events[-1].status == "done"
    for group in groups:
        assert group.group_id == f"{batch.id}/{group.task_id}"
        assert group.labels == {"step": 4}
        assert group.policy_version == "4"
        assert [s.sample_index for s in group.samples] == [0, 1, 2]
        assert group.rewards == [s.reward for s in group.samples]
        assert set(group.rewards) == {0.0, 1.0}
        assert group.informative
        for sample in group.samples:
            (stored,) = [t async for t in trajectories(store, rollouts=sample.rollout_id)]
            (sent,) = sample.trajectories
            assert sample.status == "finished"
            assert sample.verdict == ("passed" if sample.reward == 1.0 else "failed")
            np.testing.assert_array_equal(sent.prompt_ids, stored.prompt_ids)
            np.testing.assert_array_equal(sent.response_ids, stored.response_ids)
            np.testing.assert_array_equal(sent.loss_mask, stored.loss_mask)
            np.testing.assert_array_equal(sent.logprobs, stored.logprobs)
            assert sent.call_ids == list(stored.call_ids)
            assert [(t.kind, t.start, t.end) for t in sent.turns] == [
                ("answer", 0, len(stored.response_ids))
            ]
            said_yes = (sample.reward == 1.0) == (group.task_id == "say-yes")
            assert decode(sent.response_ids.tolist()) == ("yes" if said_yes else "no")
    # The batch's sampling reached the engine on every call, over the harness's own request.
    engine_requests = [body for _, _, body in engine.fake.requests]
    assert len(engine_requests) == 6
    assert all((r["temperature"], r["max_tokens"]) == (0.7, 8) for r in engine_requests)
    # The batch seed, derived per sample: every sample of a group is its own draw.
    assert sorted(r["seed"] for r in engine_requests) == sorted(
        derived_seed(11, task, sample, 0, 0)
        for task in ("say-no", "say-yes")
        for sample in range(3)
    )
    data = status.data
    assert data["status"] == "done"
    assert data["rollouts"] == {"total": 6, "by_status": {"finished": 6}}
    assert data["groups"]["kept"] == 2
    assert data["pass_at_k"]["k"] == 3
    assert data["pass_at_k"]["pass@3"] == 1.0


async def test_groups_arrive_as_they_finish(store: Store, tmp_path: Path) -> None:
    fast_done = asyncio.Event()

    def script(body: dict[str, Any]) -> Reply:
        slow = "slow" in _last_user(body)
        return Reply(text="yes", token_delay=0.6 if slow else 0.0)

    tasks = [
        {"id": "slow", "instruction": "slow: say yes", "test": "true"},
        {"id": "fast", "instruction": "fast: say yes", "test": "true"},
    ]
    async with (
        fake_engine(FakeVLLM(script=script)) as engine,
        running_service(store, engine.url, logs=tmp_path / "logs") as service,
    ):
        batch = await service.client.submit(tasks, harness="single-call", samples_per_task=2)
        order = []
        async for group in service.client.groups(batch.id):
            order.append(group.task_id)
            if group.task_id == "fast":
                fast_done.set()
                # The slow group was still running when the fast one was delivered.
                slow = await store.rollouts(batch=batch.id)
                running = [v for v in slow if v.task_id == "slow"]
                assert any(v.status is not RolloutStatus.SUCCEEDED for v in running)

    assert order == ["fast", "slow"]


async def test_arrow_and_base64_carry_the_same_arrays(store: Store, tmp_path: Path) -> None:
    async with (
        fake_engine(alternating()) as engine,
        running_service(store, engine.url, logs=tmp_path / "logs", encoding="arrow") as service,
    ):
        batch = await service.client.submit(TASKS, harness="single-call", samples_per_task=2)
        arrow = [g async for g in service.client.groups(batch.id)]
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{service.url}/v1/batches/{batch.id}/groups") as resp:
                listed = await resp.json()

    from rolltap.client import parse_group

    as_json = {g["task_id"]: parse_group(g) for g in listed["groups"]}
    assert listed["last_seq"] == 2
    assert len(arrow) == 2
    for group in arrow:
        other = as_json[group.task_id]
        for a, b in zip(group.trajectories, other.trajectories, strict=True):
            for name in ("prompt_ids", "response_ids", "loss_mask", "logprobs"):
                np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
                assert getattr(a, name).dtype == getattr(b, name).dtype
            assert a.turns == b.turns
            assert (a.rollout_id, a.call_ids, a.min_version) == (
                b.rollout_id,
                b.call_ids,
                b.min_version,
            )


async def test_submission_is_idempotent(store: Store, tmp_path: Path) -> None:
    async with (
        fake_engine(alternating()) as engine,
        running_service(store, engine.url, logs=tmp_path / "logs") as service,
    ):
        client = service.client
        first = await client.submit(TASKS, harness="single-call", batch_id="step-1")
        again = await client.submit(TASKS, harness="single-call", batch_id="step-1")
        keyed = await client.submit(TASKS, harness="single-call", idempotency_key="k1")
        keyed_again = await client.submit(TASKS, harness="single-call", idempotency_key="k1")
        with pytest.raises(ServiceError) as clash:
            await client.submit(TASKS[:1], harness="single-call", batch_id="step-1")
        for batch_id in (first.id, keyed.id):
            [e async for e in client.events(batch_id)]

    assert (first.id, first.created) == ("step-1", True)
    assert (again.id, again.created) == ("step-1", False)
    assert keyed_again.id == keyed.id
    assert (keyed.created, keyed_again.created) == (True, False)
    assert clash.value.status == 409
    assert clash.value.code == "batch_exists"
    assert len(await store.rollouts(batch="step-1")) == 2
    assert len(await store.rollouts(batch=keyed.id)) == 2


async def test_a_retry_after_a_restart_resumes_the_batch_and_keeps_what_finished(
    store: Store, tmp_path: Path
) -> None:
    async with fake_engine(alternating()) as engine:
        async with running_service(store, engine.url, logs=tmp_path / "logs") as service:
            batch = await service.client.submit(
                TASKS, harness="single-call", batch_id="resumable", samples_per_task=2
            )
            [e async for e in service.client.events(batch.id)]
        finished = {v.id for v in await store.rollouts(batch="resumable")}
        async with running_service(store, engine.url, logs=tmp_path / "logs") as service:
            again = await service.client.submit(
                TASKS, harness="single-call", batch_id="resumable", samples_per_task=2
            )
            groups = [g async for g in service.client.groups(again.id)]

    assert again.created
    assert again.data["resumed"] is True
    assert {v.id for v in await store.rollouts(batch="resumable")} == finished
    assert {s.rollout_id for g in groups for s in g.samples} == finished
    assert len(engine.fake.requests) == 4, "nothing ran twice"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"harness": "single-call"}, "tasks"),
        ({"tasks": TASKS}, "harness"),
        ({"tasks": TASKS, "harness": "nope"}, "harness"),
        ({"tasks": TASKS, "harness": "single-call", "sandbox": "docker"}, "sandbox"),
        ({"tasks": TASKS, "harness": "single-call", "samples_per_task": 0}, "samples_per_task"),
        ({"tasks": TASKS, "harness": "single-call", "keep": "some"}, "keep"),
        ({"tasks": TASKS, "harness": "single-call", "sampling": {"logit_bias": 1}}, "sampling"),
        ({"tasks": TASKS, "harness": "single-call", "budgets": {"wall": 3}}, "budgets"),
        ({"tasks": "relative/path", "harness": "single-call"}, "tasks"),
        ({"tasks": "/nowhere/at/all", "harness": "single-call"}, "tasks"),
        ({"tasks": [{"id": "x"}], "harness": "single-call"}, "tasks"),
        ({"tasks": TASKS, "harness": "single-call", "id": "bad id!"}, "id"),
        ({"tasks": TASKS, "harness": "single-call", "colour": "red"}, "colour"),
        ({"tasks": TASKS, "harness": "single-call", "egress": {"mode": "open"}}, "egress"),
        (
            {"tasks": TASKS, "harness": "single-call", "egress": {"allow": ["https://x.org/"]}},
            "egress",
        ),
    ],
)
async def test_bad_requests_get_one_clear_error(
    store: Store, tmp_path: Path, body: dict[str, Any], param: str
) -> None:
    async with (
        fake_engine() as engine,
        running_service(store, engine.url, logs=tmp_path / "logs") as service,
    ):
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{service.url}/v1/batches", json=body) as resp:
                status, error = resp.status, await resp.json()

    assert status == 400
    assert error["error"]["param"] == param
    assert "Traceback" not in error["error"]["message"]
    assert await store.rollouts() == []


async def test_the_batch_routes_need_the_admin_token(store: Store, tmp_path: Path) -> None:
    async with (
        fake_engine() as engine,
        running_service(
            store, engine.url, logs=tmp_path / "logs", admin_token="tok-123"
        ) as service,
    ):
        async with aiohttp.ClientSession() as session:
            for method, path in [
                ("POST", "/v1/batches"),
                ("GET", "/v1/batches"),
                ("GET", "/v1/batches/x/events"),
                ("DELETE", "/v1/batches/x"),
            ]:
                async with session.request(method, service.url + path, json={}) as resp:
                    assert resp.status == 401, path
                    assert "tok-123" not in await resp.text()
        # The rollout keys' own /v1 routes do not open the batch routes either.
        created = await store.create_rollout()
        async with aiohttp.ClientSession() as session:
            async with session.get(
                f"{service.url}/v1/batches", headers={"Authorization": f"Bearer {created.key}"}
            ) as resp:
                assert resp.status == 401
        batch = await service.client.submit(TASKS[:1], harness="single-call")
        assert (await service.client.batch(batch.id)).id == batch.id
        await service.client.cancel(batch.id)


async def test_an_unreadable_event_stream_reconnects_where_it_left(
    store: Store, tmp_path: Path
) -> None:
    async with (
        fake_engine(alternating()) as engine,
        running_service(store, engine.url, logs=tmp_path / "logs") as service,
    ):
        batch = await service.client.submit(TASKS, harness="single-call", samples_per_task=2)
        everything = [e async for e in service.client.events(batch.id)]
        first_two = everything[:2]
        rest = [e async for e in service.client.events(batch.id, after=2)]
        async with aiohttp.ClientSession() as session:
            async with session.get(
                f"{service.url}/v1/batches/{batch.id}/events",
                headers={"Last-Event-ID": "2"},
            ) as resp:
                raw = await resp.text()

    assert len(everything) == 3
    assert [type(e) for e in first_two] == [Group, Group]
    assert len(rest) == 1
    assert isinstance(rest[0], Batch)
    assert raw.startswith("id: 3\nevent: done\n")
    assert not any(isinstance(e, Dropped) for e in everything)
