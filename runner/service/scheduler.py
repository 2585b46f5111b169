"""Running a batch: launch groups from its task pool, judge each complete group, stop early.

Each task becomes a group: `samples_per_task` rollouts planned in the store and started on the
executor. Groups launch while the batch has room (`concurrency` rollouts in flight); with
`target_groups: K` they also stop launching once the groups in flight are enough to reach K at
the share of groups kept so far (DAPO-style dynamic sampling with asynchronous replenishment),
and once K groups are kept every rollout still running is cancelled: its sandbox killed, its
row marked cancelled, nothing recorded deleted. A group completes when all its samples
finished; it is judged (informative, stale) and recorded as a kept or dropped event.

With `max_staleness`, the bound goes into each rollout's meta and the proxy holds it as it
dispatches the rollout's calls (proxy/staleness.py). An attempt the proxy stopped for
`stale: "relaunch"` is followed here by a new attempt of the same sample, which starts on the
weights then in force; it takes the old attempt's place in the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from dataclasses import dataclass, field

from ...analysis.reading import analyze_rollout, build_trajectories
from ...proxy.staleness import BOUND, StaleBound, StalePolicy, ended_stale
from ...store import RolloutStatus, Store
from ...store.events import Cancelled
from ...store.store import FINAL_STATUSES
from ..plan import Planned, plan, relaunch
from ..rollout import RolloutResult
from ..tasks import Task
from .batch import Batch, BatchStatus
from .clock import PolicyClock
from .events import EventKind
from .executor import RolloutExecutor
from .groups import dropped_message, judge

log = logging.getLogger("rolltap.runner.service")


@dataclass
class _Group:
    task: Task
    rollout_ids: dict[int, str]
    """Sample index -> the attempt that counts (planned now, or finished in an earlier run)."""
    running: set[asyncio.Task[RolloutResult]] = field(default_factory=set)


class Scheduler:
    def __init__(
        self,
        batch: Batch,
        executor: RolloutExecutor,
        store: Store,
        clock: PolicyClock,
        model: str,
    ) -> None:
        self._batch = batch
        self._executor = executor
        self._store = store
        self._clock = clock
        self._model = model
        self._groups: dict[asyncio.Task[RolloutResult], _Group] = {}
        self._in_flight: list[_Group] = []

    async def run(self) -> None:
        """Until the pool is spent or the target reached; cancelled: stops every rollout."""
        batch = self._batch
        pool = deque(batch.spec.tasks)
        try:
            while True:
                await self._complete_finished_groups()
                if batch.target_reached:
                    break
                while pool and self._room():
                    await self._launch(pool.popleft())
                if not self._in_flight:
                    break
                if self._groups and all(g.running for g in self._in_flight):
                    await asyncio.wait(self._groups.keys(), return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Reached the target, cancelled, or failed: nothing of this batch keeps running.
            await asyncio.shield(self._stop_all())

    def _room(self) -> bool:
        batch, spec = self._batch, self._batch.spec
        if batch.rollouts_in_flight and (
            batch.rollouts_in_flight + spec.samples_per_task > spec.concurrency
        ):
            return False
        if spec.target_groups is None:
            return True
        remaining = spec.target_groups - len(batch.kept)
        if remaining <= 0:
            return False
        # The share of groups kept so far, with a prior of one kept in two.
        share = (len(batch.kept) + 1) / (len(batch.groups) + 2)
        return batch.groups_in_flight < math.ceil(remaining / share)

    async def _launch(self, task: Task) -> None:
        batch, spec = self._batch, self._batch.spec
        todo, kept = await plan(
            self._store,
            batch.id,
            [task],
            spec.samples_per_task,
            harness=spec.harness,
            model=self._model,
            budgets=spec.budgets,
            meta=self._rollout_meta(),
        )
        group = _Group(task, {v.sample_index or 0: v.id for v in kept})
        for planned in todo:
            group.rollout_ids[planned.sample_index] = planned.rollout_id
            self._start(group, planned)
        batch.tasks_launched += 1
        batch.groups_in_flight += 1
        self._in_flight.append(group)

    def _rollout_meta(self) -> dict[str, object]:
        spec = self._batch.spec
        meta: dict[str, object] = {
            "sandbox": spec.sandbox,
            "service": {"fingerprint": spec.fingerprint, "labels": dict(spec.labels)},
        }
        if spec.policy_version is not None:
            meta["policy_version"] = spec.policy_version
        if spec.sampling:
            # The proxy applies these to every engine call of the rollout.
            meta["sampling"] = dict(spec.sampling)
        if spec.capture_routed_experts:
            meta["routed_experts"] = True
        if spec.max_staleness is not None:
            # The proxy holds it at each dispatch of the rollout's calls.
            meta[BOUND] = StaleBound(spec.max_staleness, spec.stale).as_meta()
        return meta

    def _start(self, group: _Group, planned: Planned) -> None:
        running = asyncio.ensure_future(self._run_one(group, planned))
        group.running.add(running)
        self._groups[running] = group
        self._batch.rollouts_in_flight += 1

    async def _run_one(self, group: _Group, planned: Planned) -> RolloutResult:
        try:
            result = await self._executor.run(planned)
            # Past the cap, a sample stopped again is kept as it ended (cancelled, marked stale).
            for _ in range(self._batch.spec.max_relaunches):
                again = await self._relaunch(planned, result)
                if again is None:
                    break
                group.rollout_ids[planned.sample_index] = again.rollout_id
                planned = again
                result = await self._executor.run(planned)
        finally:
            self._batch.rollouts_in_flight -= 1
        # An infrastructure retry runs as a new attempt: that attempt is the sample now.
        group.rollout_ids[planned.sample_index] = result.rollout_id
        return result

    async def _relaunch(self, planned: Planned, result: RolloutResult) -> Planned | None:
        """The next attempt of a sample the proxy stopped for running too far behind the
        policy (`stale: "relaunch"`), or None."""
        spec = self._batch.spec
        if spec.stale is not StalePolicy.RELAUNCH or result.status is not RolloutStatus.CANCELLED:
            return None
        view = await self._store.rollout(result.rollout_id)
        if not ended_stale(view.meta, StalePolicy.RELAUNCH):
            return None
        self._batch.relaunched += 1
        return await relaunch(self._store, planned, view, self._rollout_meta())

    async def _complete_finished_groups(self) -> None:
        for running in [t for t in self._groups if t.done()]:
            group = self._groups.pop(running)
            group.running.discard(running)
            error = None if running.cancelled() else running.exception()
            if error is not None:
                # The executor broke (not the rollout: those end as results): the batch fails.
                raise error
        for group in [g for g in self._in_flight if not g.running]:
            self._in_flight.remove(group)
            self._batch.groups_in_flight -= 1
            await self._judge(group)

    async def _judge(self, group: _Group) -> None:
        batch = self._batch
        ids = [group.rollout_ids[i] for i in sorted(group.rollout_ids)]
        views = {v.id: v for v in await self._store.rollouts(ids=ids)}
        built = await build_trajectories(self._store, [views[i] for i in ids])
        clock = await self._clock.read()
        record = judge(len(batch.groups) + 1, group.task.id, built, batch.spec, clock)
        batch.groups.append(record)
        if record.kept:
            batch.recent.keep(record.seq, built)
            await batch.events.append(EventKind.GROUP, {"record": record})
        else:
            await batch.events.append(EventKind.DROPPED, dropped_message(batch.id, record))

    async def _stop_all(self) -> None:
        """Cancel every rollout still running and record it as cancelled."""
        running = list(self._groups)
        for task in running:
            task.cancel()
        for task in running:
            with contextlib.suppress(BaseException):
                await task
        why = self._why_stopped()
        for group in self._in_flight:
            for rollout_id in group.rollout_ids.values():
                view = await self._store.rollout(rollout_id)
                if view.status in FINAL_STATUSES:
                    continue
                await self._store.report(rollout_id, Cancelled(why))
                if view.n_calls:
                    await analyze_rollout(self._store, rollout_id)
                self._store.forget(rollout_id)
                self._batch.cancelled_rollouts += 1
        self._groups.clear()
        self._batch.groups_in_flight = 0

    def _why_stopped(self) -> str:
        batch = self._batch
        if batch.target_reached:
            return f"cancelled: the batch kept its {batch.spec.target_groups} groups"
        if batch.status is BatchStatus.CANCELLED:
            return f"cancelled: {batch.error or 'DELETE /v1/batches'}"
        return "cancelled: the batch stopped"
