"""Dynamic sampling and cancellation on the real service: uninformative groups dropped,
`target_groups` stops the batch and cancels the redundant rollouts still running, DELETE kills
every sandbox and process of a batch and marks its rollouts cancelled, deleting nothing."""

from __future__ import annotations

import itertools
import secrets
from pathlib import Path
from typing import Any

from rolltap.client import Batch, Dropped, Group
from rolltap.runner.sandboxes.bwrap import BwrapProvider
from rolltap.store import CallStatus, RolloutStatus, Store
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import fake_engine
from tests.support.sandboxes import host_processes_running
from tests.support.service import running_service
from tests.support.waiting import until


def _mark() -> str:
    """A sleep length no other process on the machine uses, to find our sleeps by."""
    return f"9{secrets.randbelow(10**6):06d}.{secrets.randbelow(10**6):06d}"


def _answers() -> FakeVLLM:
    """`mixed` tasks get yes and no in turn, every other task always yes."""
    turn = itertools.count()

    def script(body: dict[str, Any]) -> Reply:
        asked = str(body["messages"][-1]["content"])
        if asked.startswith("mixed"):
            return Reply(text="yes" if next(turn) % 2 else "no")
        return Reply(text="yes")

    return FakeVLLM(script=script)


def _harness(mark: str) -> str:
    """Asks the model its instruction and writes the answer; `slow` tasks sleep first."""
    return (
        f'case "$ROLLTAP_INSTRUCTION" in slow*) sleep {mark};; esac; '
        'python3 "$ROLLTAP_ASK" "$ROLLTAP_INSTRUCTION" > answer.txt'
    )


def _task(task_id: str) -> dict[str, str]:
    return {"id": task_id, "instruction": f"{task_id}: say yes", "test": "grep -q yes answer.txt"}


async def test_informative_groups_are_kept_and_uninformative_ones_dropped(
    store: Store, tmp_path: Path
) -> None:
    async with (
        fake_engine(_answers()) as engine,
        running_service(
            store, engine.url, logs=tmp_path / "logs", scripts={"ask": _harness(_mark())}
        ) as service,
    ):
        batch = await service.client.submit(
            [_task("always"), _task("mixed")], harness="ask", samples_per_task=2, keep="informative"
        )
        events = [e async for e in service.client.events(batch.id)]

    dropped = [e for e in events if isinstance(e, Dropped)]
    kept = [e for e in events if isinstance(e, Group)]
    assert [(d.task_id, d.reason, d.rewards) for d in dropped] == [
        ("always", "uninformative", [1.0, 1.0])
    ]
    assert [(g.task_id, sorted(g.rewards)) for g in kept] == [("mixed", [0.0, 1.0])]
    done = events[-1]
    assert isinstance(done, Batch)
    assert done.data["groups"]["dropped"] == {"uninformative": 1}


async def test_target_groups_cancels_the_redundant_rollouts_still_running(
    store: Store, tmp_path: Path
) -> None:
    mark = _mark()
    tasks = [_task("always"), _task("slow-1"), _task("slow-2"), _task("mixed")]
    async with (
        fake_engine(_answers()) as engine,
        running_service(
            store, engine.url, logs=tmp_path / "logs", scripts={"ask": _harness(mark)}
        ) as service,
    ):
        batch = await service.client.submit(
            tasks,
            harness="ask",
            samples_per_task=2,
            keep="informative",
            target_groups=1,
            concurrency=8,
        )
        events = [e async for e in service.client.events(batch.id)]
        assert host_processes_running(f"sleep {mark}") == []

    kinds = [(type(e).__name__, getattr(e, "task_id", None)) for e in events]
    assert kinds == [("Dropped", "always"), ("Group", "mixed"), ("Batch", None)]
    done = events[-1]
    assert isinstance(done, Batch)
    assert done.status == "done"
    assert done.data["target_reached"] is True
    assert done.data["cancelled_rollouts"] == 4
    views = {v.task_id: [] for v in await store.rollouts(batch=batch.id)}
    for view in await store.rollouts(batch=batch.id):
        views[view.task_id].append(view)
    assert set(views) == {"always", "slow-1", "slow-2", "mixed"}
    for task_id in ("slow-1", "slow-2"):
        for view in views[task_id]:
            assert view.status is RolloutStatus.CANCELLED
            assert view.error == "cancelled: the batch kept its 1 groups"
    for task_id in ("always", "mixed"):
        assert all(v.status is RolloutStatus.SUCCEEDED for v in views[task_id])
    assert await BwrapProvider().sweep(batch.id) == 0


async def test_cancel_kills_every_sandbox_and_marks_rollouts_cancelled_deleting_nothing(
    store: Store, tmp_path: Path
) -> None:
    mark = _mark()
    # Each rollout makes one call, then hangs in its sandbox until killed.
    script = f'python3 "$ROLLTAP_ASK" "$ROLLTAP_INSTRUCTION" > answer.txt && sleep {mark}'
    async with (
        fake_engine(_answers()) as engine,
        running_service(
            store, engine.url, logs=tmp_path / "logs", scripts={"hang": script}
        ) as service,
    ):
        batch = await service.client.submit(
            [_task("a"), _task("b")], harness="hang", samples_per_task=2
        )

        async def all_hanging() -> bool:
            views = await store.rollouts(batch=batch.id)
            called = len(views) == 4 and all(v.n_calls == 1 for v in views)
            return called and len(host_processes_running(f"sleep {mark}")) >= 4

        await until(all_hanging, "every rollout called the model and hangs")
        cancelled = await service.client.cancel(batch.id)
        left = host_processes_running(f"sleep {mark}")
        events = [e async for e in service.client.events(batch.id)]
        again = await service.client.cancel(batch.id)

    assert cancelled.status == "cancelled"
    assert left == []
    assert await BwrapProvider().sweep(batch.id) == 0
    views = await store.rollouts(batch=batch.id)
    assert len(views) == 4
    for view in views:
        assert view.status is RolloutStatus.CANCELLED
        assert view.error == "cancelled: DELETE /v1/batches"
        calls = await store.calls(view.id)
        assert [c.status for c in calls] == [CallStatus.OK], "the recorded call is kept"
    assert isinstance(events[-1], Batch)
    assert events[-1].status == "cancelled"
    assert again.status == "cancelled"
