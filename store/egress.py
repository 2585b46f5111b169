"""Egress records: what a rollout's sandbox asked of the network, and what the gate decided."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.engine import Connection

from .models import EgressVerdict, egress_request_table

E = egress_request_table


@dataclass(frozen=True)
class EgressRecord:
    id: str
    """Made by the recorder (store.ids.new_id), so a retried write finds what it wrote."""
    rollout_id: str
    at: datetime
    method: str
    host: str
    path: str
    status: int | None
    request_bytes: int
    response_bytes: int
    verdict: EgressVerdict
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "rollout_id": self.rollout_id,
            "at": self.at.isoformat(),
            "method": self.method,
            "host": self.host,
            "path": self.path,
            "status": self.status,
            "request_bytes": self.request_bytes,
            "response_bytes": self.response_bytes,
            "verdict": self.verdict.value,
            "reason": self.reason,
        }


def insert_records(conn: Connection, records: Sequence[EgressRecord]) -> None:
    """Idempotent (the writer may run it again after a lost acknowledgement)."""
    if not records:
        return
    ids = [r.id for r in records]
    present = set(conn.execute(select(E.c.id).where(E.c.id.in_(ids))).scalars())
    rows = [
        {
            "id": r.id,
            "rollout_id": r.rollout_id,
            "at": r.at,
            "method": r.method,
            "host": r.host,
            "path": r.path,
            "status": r.status,
            "request_bytes": r.request_bytes,
            "response_bytes": r.response_bytes,
            "verdict": r.verdict.value,
            "reason": r.reason,
        }
        for r in records
        if r.id not in present
    ]
    if rows:
        conn.execute(insert(E), rows)


def records_of(conn: Connection, rollout_id: str) -> list[EgressRecord]:
    rows = conn.execute(
        select(E).where(E.c.rollout_id == rollout_id).order_by(E.c.at, E.c.id)
    ).mappings()
    return [
        EgressRecord(
            id=row["id"],
            rollout_id=row["rollout_id"],
            at=row["at"],
            method=row["method"],
            host=row["host"],
            path=row["path"],
            status=row["status"],
            request_bytes=row["request_bytes"],
            response_bytes=row["response_bytes"],
            verdict=EgressVerdict(row["verdict"]),
            reason=row["reason"],
        )
        for row in rows
    ]
