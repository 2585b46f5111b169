"""One batch as the service keeps it in memory: its spec, progress, complete groups and events.

Rollouts, calls and rewards live in the store; this is what only the running service knows:
which tasks it launched, which groups are complete and whether each was kept.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .events import EventLog
from .groups import GroupRecord, RecentGroups
from .spec import BatchSpec, describe


class BatchStatus(enum.StrEnum):
    RUNNING = "running"
    DONE = "done"
    """Every task ran, or the target number of kept groups was reached."""
    CANCELLED = "cancelled"
    FAILED = "failed"
    """The service could not run it (a sandbox kind that does not work here, say)."""


@dataclass
class Batch:
    id: str
    spec: BatchSpec
    idempotency_key: str | None = None
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    status: BatchStatus = BatchStatus.RUNNING
    finished_at: datetime | None = None
    error: str | None = None
    resumed: bool = False
    """Submitted again after the service restarted: finished rollouts were kept."""
    events: EventLog = field(default_factory=EventLog)
    groups: list[GroupRecord] = field(default_factory=list)
    """Complete groups, kept or not, in the order they completed."""
    recent: RecentGroups = field(default_factory=RecentGroups)
    """The trajectories of the groups judged last, for their first delivery."""
    tasks_launched: int = 0
    groups_in_flight: int = 0
    rollouts_in_flight: int = 0
    cancelled_rollouts: int = 0
    """Rollouts stopped before they finished (DELETE, a reached target, shutdown)."""
    relaunched: int = 0
    """Attempts stopped for staleness and run again (`stale: "relaunch"`)."""
    runner: asyncio.Task[None] | None = None

    @property
    def kept(self) -> list[GroupRecord]:
        return [g for g in self.groups if g.kept]

    @property
    def target_reached(self) -> bool:
        target = self.spec.target_groups
        return target is not None and len(self.kept) >= target

    def finish(self, status: BatchStatus, error: str | None = None) -> None:
        if self.status is BatchStatus.RUNNING:
            self.status = status
            self.error = error
            self.finished_at = datetime.now(UTC)

    def summary(self) -> dict[str, Any]:
        """The counts the batch's JSON and its DONE event show (the store adds the rest)."""
        dropped: dict[str, int] = {}
        for group in self.groups:
            if group.reason is not None:
                dropped[group.reason] = dropped.get(group.reason, 0) + 1
        return {
            "id": self.id,
            "status": self.status.value,
            "error": self.error,
            "created_at": self.created_at.isoformat(),
            "finished_at": None if self.finished_at is None else self.finished_at.isoformat(),
            "resumed": self.resumed,
            "tasks": {
                "total": len(self.spec.tasks),
                "launched": self.tasks_launched,
                "remaining": len(self.spec.tasks) - self.tasks_launched,
            },
            "groups": {
                "complete": len(self.groups),
                "kept": len(self.kept),
                "dropped": dropped,
                "in_flight": self.groups_in_flight,
                "informative": sum(1 for g in self.groups if g.informative),
            },
            "target_groups": self.spec.target_groups,
            "target_reached": self.target_reached,
            "rollouts_in_flight": self.rollouts_in_flight,
            "cancelled_rollouts": self.cancelled_rollouts,
            "relaunched_rollouts": self.relaunched,
            "spec": describe(self.spec),
        }
