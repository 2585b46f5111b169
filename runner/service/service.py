"""The rollout service: batches submitted over HTTP, run in the background, kept in memory.

Submission is idempotent. The batch id is the client's (`id`), else derived from its
`Idempotency-Key`, else fresh; a second POST naming an id the service knows returns that batch
when the body is the same and is refused (409) when it is not. After a restart, a POST naming a
batch whose rollouts the store holds resumes it: finished rollouts are kept, unfinished samples
run again as new attempts (`rolltap.runner.plan`), nothing recorded is deleted.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import UTC, datetime
from typing import Any

from ...analysis import outcomes
from ...store import Store, StoreError
from ...store.ids import new_id
from ...store.models import MetricsSource
from ...store.training import PostedMetrics, metrics_of
from ..summary import current_attempts, summarize
from .batch import Batch, BatchStatus
from .clock import PolicyClock
from .events import EventKind
from .executor import ExecutorFactory
from .posted import service_record
from .scheduler import Scheduler
from .spec import ServiceLimits, SpecError, parse_spec

log = logging.getLogger("rolltap.runner.service")


class UnknownBatch(LookupError):
    pass


class BatchConflict(Exception):
    """The batch id is taken by a batch asking for something else."""


class Service:
    def __init__(
        self,
        store: Store,
        clock: PolicyClock,
        executors: ExecutorFactory,
        *,
        harnesses: Collection[str],
        model: Callable[[], Awaitable[str]],
        limits: ServiceLimits | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.limits = limits or ServiceLimits()
        self._executors = executors
        self._harnesses = set(harnesses)
        self._model = model
        self._batches: dict[str, Batch] = {}
        self._submitting = asyncio.Lock()
        self.session = new_id()
        """This service's run: the training view shows the batches of one session together."""

    async def submit(
        self, body: dict[str, Any], idempotency_key: str | None = None
    ) -> tuple[Batch, bool]:
        """(the batch, whether this call created it). Raises SpecError, BatchConflict."""
        # Reading a task directory is file I/O: off the event loop.
        spec = await asyncio.to_thread(parse_spec, body, self.limits)
        if spec.harness not in self._harnesses:
            known = ", ".join(sorted(self._harnesses))
            raise SpecError(
                f"unknown harness {spec.harness!r}; this service runs {known}", "harness"
            )
        async with self._submitting:
            batch_id = spec.id or _keyed_id(idempotency_key) or f"b-{new_id().lower()}"
            known_batch = self._batches.get(batch_id)
            if known_batch is not None:
                if known_batch.spec.fingerprint != spec.fingerprint:
                    raise BatchConflict(
                        f"batch {batch_id} exists and asked for something else; use another id"
                    )
                return known_batch, False
            stored = await self.store.rollouts(batch=batch_id, limit=1)
            if stored:
                service_meta = stored[0].meta.get("service") or {}
                if service_meta.get("fingerprint") != spec.fingerprint:
                    raise BatchConflict(
                        f"the store holds a batch {batch_id} that asked for something else"
                    )
            batch = Batch(batch_id, spec, idempotency_key, resumed=bool(stored))
            self._batches[batch_id] = batch
            await self._record(batch)
            batch.runner = asyncio.ensure_future(self._run(batch))
            return batch, True

    def get(self, batch_id: str) -> Batch:
        batch = self._batches.get(batch_id)
        if batch is None:
            raise UnknownBatch(batch_id)
        return batch

    def batches(self) -> list[Batch]:
        return list(self._batches.values())

    async def record_metrics(
        self, batch_id: str, policy_version: str | None, metrics: Mapping[str, Any]
    ) -> PostedMetrics:
        """Store what a trainer posts about a batch (the batch's policy version unless it says
        another). Raises UnknownBatch for a batch neither this service nor the store knows."""
        known = await self._policy_version(batch_id)
        record = PostedMetrics(
            id=new_id(),
            batch_id=batch_id,
            source=MetricsSource.TRAINER,
            policy_version=policy_version if policy_version is not None else known,
            session=None,
            posted_at=datetime.now(UTC),
            metrics=dict(metrics),
        )
        await self.store.record_metrics(record)
        return record

    async def metrics(self, batch_id: str) -> list[PostedMetrics]:
        """What trainers posted about a batch, oldest first."""
        await self._policy_version(batch_id)
        return await self.store.db.read(metrics_of, [batch_id], source=MetricsSource.TRAINER)

    async def _policy_version(self, batch_id: str) -> str | None:
        batch = self._batches.get(batch_id)
        if batch is not None:
            return batch.spec.policy_version
        stored = await self.store.rollouts(batch=batch_id, limit=1)
        if not stored:
            raise UnknownBatch(batch_id)
        version = stored[0].meta.get("policy_version")
        return None if version is None else str(version)

    async def cancel(self, batch_id: str) -> Batch:
        """Stop the batch: its sandboxes killed, its unfinished rollouts marked cancelled."""
        batch = self.get(batch_id)
        batch.finish(BatchStatus.CANCELLED)
        await self._stop(batch)
        return batch

    async def close(self) -> None:
        """Stop every running batch (the service is shutting down)."""
        for batch in self._batches.values():
            batch.finish(BatchStatus.CANCELLED, "the service stopped")
        await asyncio.gather(*(self._stop(b) for b in self._batches.values()))

    async def status(self, batch: Batch) -> dict[str, Any]:
        """The batch's counts: rollouts by status, groups, and pass@k over complete groups."""
        data = batch.summary()
        data["session"] = self.session
        views = current_attempts(await self.store.rollouts(batch=batch.id))
        statuses: dict[str, int] = {}
        for view in views:
            statuses[view.status.value] = statuses.get(view.status.value, 0) + 1
        complete = {rid for g in batch.groups for rid in g.rollout_ids}
        summary = summarize(batch.id, [v for v in views if v.id in complete], 0.0)
        k = batch.spec.samples_per_task
        tasks = [t for t in summary.tasks if t.samples == k]
        data["rollouts"] = {"total": len(views), "by_status": statuses}
        bridging = await outcomes.bridging(self.store, batch_id=batch.id)
        data["bridging"] = None if bridging is None else bridging.as_dict()
        parsing = await outcomes.tool_parsing(self.store, batch_id=batch.id)
        data["tool_parsing"] = None if parsing is None else parsing.as_dict()
        data["reward"] = {"mean": summary.mean_reward}
        data["pass_at_k"] = {
            "k": k,
            "tasks": len(tasks),
            "pass@1": _mean([t.pass_at_1 for t in tasks]),
            f"pass@{k}": _mean([t.pass_at_k for t in tasks]),
        }
        return data

    async def _run(self, batch: Batch) -> None:
        try:
            model = await self._model()
            async with self._executors(batch.spec, batch.id) as executor:
                await Scheduler(batch, executor, self.store, self.clock, model).run()
            batch.finish(BatchStatus.DONE)
        except asyncio.CancelledError:
            batch.finish(BatchStatus.CANCELLED)
        except Exception as e:
            log.exception("batch %s failed", batch.id)
            batch.finish(BatchStatus.FAILED, f"{type(e).__name__}: {e}")
        finally:
            await self._record(batch)
            await batch.events.append(EventKind.DONE, await self.status(batch))

    async def _record(self, batch: Batch) -> None:
        """The batch's service record (session, labels, groups kept and dropped), as it starts
        and as it ends, for the training view; a store that fails it costs the view only."""
        record = PostedMetrics(
            id=new_id(),
            batch_id=batch.id,
            source=MetricsSource.SERVICE,
            policy_version=batch.spec.policy_version,
            session=self.session,
            posted_at=datetime.now(UTC),
            metrics=service_record(batch),
        )
        try:
            await self.store.record_metrics(record)
        except StoreError as e:
            log.warning("batch %s: its service record was not stored: %s", batch.id, e)

    async def _stop(self, batch: Batch) -> None:
        runner = batch.runner
        if runner is not None and not runner.done():
            runner.cancel()
            await asyncio.wait([runner])


def _keyed_id(key: str | None) -> str | None:
    """A stable batch id for an Idempotency-Key, so a retry after a restart finds its batch."""
    if not key:
        return None
    return "k-" + hashlib.sha256(key.encode()).hexdigest()[:24]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
