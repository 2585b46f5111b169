"""A batch's status has its answers' tool-call parse outcomes and malformed_call_rate."""

from __future__ import annotations

from typing import Any

from rolltap.proxy.hold import WeightHold
from rolltap.runner.service.batch import Batch
from rolltap.runner.service.clock import HoldClock
from rolltap.runner.service.service import Service
from rolltap.runner.service.spec import BatchSpec
from rolltap.store import NewRollout, Store
from tests.support.records import call


def _no_executor(spec: BatchSpec, batch_id: str) -> Any:
    raise AssertionError("status runs nothing")


async def _model() -> str:
    return "m"


async def test_batch_status_counts_malformed_calls(store: Store) -> None:
    outcomes = [["ok", "malformed: call 1: no name"], ["ok", "none", None]]
    for k, answers in enumerate(outcomes):
        rollout = (
            await store.create_rollout(NewRollout(task_id="t", batch_id="b", sample_index=k))
        ).id
        for j, outcome in enumerate(answers):
            await store.append_call(call(rollout, [1, j], [2], tool_parse=outcome))
    other = (await store.create_rollout(NewRollout(task_id="t", batch_id="other"))).id
    await store.append_call(call(other, [1], [2], tool_parse="malformed: call 1: no name"))
    service = Service(store, HoldClock(WeightHold()), _no_executor, harnesses=(), model=_model)
    spec = BatchSpec(tasks=(), tasks_source="inline", harness="single-call", sandbox="local")

    data = await service.status(Batch(id="b", spec=spec))

    assert data["tool_parsing"] == {
        "answers": 4,
        "ok": 2,
        "malformed": 1,
        "none": 1,
        "malformed_call_rate": 1 / 3,
        "reasons": ["tool call 1: no name"],  # recorded as `call 1: ...`, read as it is now
    }
