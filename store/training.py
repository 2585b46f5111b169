"""What a training run's batches hold beyond their rollouts: the figures a trainer posts about a
batch and what the rollout service recorded of it (the batch_metrics table), and per-batch
counts of their calls (weight versions, token-in outcomes) for the training view."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.engine import Connection

from .models import MetricsSource, batch_metrics_table, call_table, rollout_table

M = batch_metrics_table
C = call_table
R = rollout_table


@dataclass(frozen=True)
class PostedMetrics:
    id: str
    """Made by the poster (store.ids.new_id), so a retried write finds what it wrote."""
    batch_id: str
    source: MetricsSource
    policy_version: str | None
    session: str | None
    posted_at: datetime
    metrics: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "batch_id": self.batch_id,
            "source": self.source.value,
            "policy_version": self.policy_version,
            "session": self.session,
            "posted_at": self.posted_at.isoformat(),
            "metrics": self.metrics,
        }


@dataclass(frozen=True)
class SessionView:
    """A rollout-service session: the batches it ran (those with a service record)."""

    session: str
    batches: int
    first_at: datetime
    last_at: datetime


def insert_metrics(conn: Connection, record: PostedMetrics) -> None:
    """Idempotent (the writer may run it again after a lost acknowledgement)."""
    if conn.execute(select(M.c.id).where(M.c.id == record.id)).first() is not None:
        return
    conn.execute(
        insert(M),
        {
            "id": record.id,
            "batch_id": record.batch_id,
            "source": record.source.value,
            "policy_version": record.policy_version,
            "session": record.session,
            "posted_at": record.posted_at,
            "metrics": record.metrics,
        },
    )


def metrics_of(
    conn: Connection,
    batch_ids: Sequence[str] | None = None,
    *,
    session: str | None = None,
    source: MetricsSource | None = None,
) -> list[PostedMetrics]:
    """Posted records, oldest first: of these batches, or of one service session."""
    query = select(M).order_by(M.c.posted_at, M.c.id)
    if batch_ids is not None:
        query = query.where(M.c.batch_id.in_(list(batch_ids)))
    if session is not None:
        query = query.where(M.c.session == session)
    if source is not None:
        query = query.where(M.c.source == source.value)
    return [
        PostedMetrics(
            id=m["id"],
            batch_id=m["batch_id"],
            source=MetricsSource(m["source"]),
            policy_version=m["policy_version"],
            session=m["session"],
            posted_at=m["posted_at"],
            metrics=dict(m["metrics"] or {}),
        )
        for m in conn.execute(query).mappings()
    ]


def sessions(conn: Connection, limit: int = 50) -> list[SessionView]:
    """The service sessions that ran batches, the most recent first."""
    query = (
        select(
            M.c.session,
            func.count(func.distinct(M.c.batch_id)),
            func.min(M.c.posted_at),
            func.max(M.c.posted_at),
        )
        .where(M.c.session.is_not(None), M.c.source == MetricsSource.SERVICE.value)
        .group_by(M.c.session)
        .order_by(func.max(M.c.posted_at).desc())
        .limit(limit)
    )
    return [SessionView(s, int(n), first, last) for s, n, first, last in conn.execute(query)]


def call_versions(conn: Connection, batch_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """Batch -> the weight version its calls were sampled with -> calls (calls an engine saw:
    those with a version)."""
    query = (
        select(R.c.batch_id, C.c.weight_version, func.count())
        .select_from(C.join(R, C.c.rollout_id == R.c.id))
        .where(R.c.batch_id.in_(list(batch_ids)), C.c.weight_version.is_not(None))
        .group_by(R.c.batch_id, C.c.weight_version)
    )
    found: dict[str, dict[str, int]] = defaultdict(dict)
    for batch_id, version, n in conn.execute(query):
        found[batch_id][str(version)] = int(n)
    return dict(found)
