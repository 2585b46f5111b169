"""Which weights served a version: the per-parameter checksums each engine reported for it (the
weight_checksum table), and how two versions' weights differ."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.engine import Connection

from .chain import checksums_digest
from .models import weight_checksum_table

W = weight_checksum_table


@dataclass(frozen=True)
class WeightChecksums:
    id: str
    """Made by the caller (store.ids.new_id), so a retried write finds what it wrote."""
    weight_version: str
    backend: str
    recorded_at: datetime
    checksums: dict[str, str]

    @property
    def digest(self) -> str:
        """store/chain.py `checksums_digest` of `checksums`."""
        return checksums_digest(self.checksums)

    def as_dict(self) -> dict[str, Any]:
        return {
            "weight_version": self.weight_version,
            "backend": self.backend,
            "recorded_at": self.recorded_at.isoformat(),
            "parameters": len(self.checksums),
            "digest": self.digest,
        }


@dataclass(frozen=True)
class WeightsDiff:
    """Two versions' weights compared parameter by parameter (`rolltap audit weights`)."""

    old: str
    new: str
    changed: list[str]
    added: list[str]
    removed: list[str]
    same: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "old": self.old,
            "new": self.new,
            "changed": self.changed,
            "added": self.added,
            "removed": self.removed,
            "same": self.same,
        }


def insert_checksums(conn: Connection, record: WeightChecksums) -> None:
    """Idempotent (the writer may run it again after a lost acknowledgement)."""
    if conn.execute(select(W.c.id).where(W.c.id == record.id)).first() is not None:
        return
    conn.execute(
        insert(W).values(
            id=record.id,
            weight_version=record.weight_version,
            backend=record.backend,
            recorded_at=record.recorded_at,
            checksums=record.checksums,
        )
    )


def checksums_of(conn: Connection, weight_version: str | None = None) -> list[WeightChecksums]:
    """Every engine's checksums of `weight_version` (of every version when None), oldest first."""
    query = select(W).order_by(W.c.recorded_at, W.c.id)
    if weight_version is not None:
        query = query.where(W.c.weight_version == weight_version)
    return [
        WeightChecksums(r.id, r.weight_version, r.backend, r.recorded_at, dict(r.checksums))
        for r in conn.execute(query)
    ]


def version_digest(digests: list[str]) -> str:
    """The digest calls under a version are sealed with, from each engine's checksums digest:
    the engines' one digest, or (engines reporting different checksums, as different parallel
    layouts do) the digest of their sorted distinct digests."""
    distinct = sorted(set(digests))
    if len(distinct) == 1:
        return distinct[0]
    return checksums_digest({d: d for d in distinct})


def compare(old: WeightChecksums, new: WeightChecksums) -> WeightsDiff:
    a, b = old.checksums, new.checksums
    return WeightsDiff(
        old=old.weight_version,
        new=new.weight_version,
        changed=sorted(k for k in a.keys() & b.keys() if a[k] != b[k]),
        added=sorted(b.keys() - a.keys()),
        removed=sorted(a.keys() - b.keys()),
        same=sum(1 for k in a.keys() & b.keys() if a[k] == b[k]),
    )
