"""Batch leases: which process runs a batch now (the batch_lease table).

Each write is one conditional statement, so two processes racing for one batch (on SQLite or
PostgreSQL) cannot both win: the insert of a free batch does nothing where a row exists, and a
takeover replaces the row only if it still holds the holder the taker judged gone. Every
function is idempotent for the writer's retry after a lost acknowledgement: a holder that
finds itself already holding has taken the lease.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from .models import batch_lease_table

L = batch_lease_table


@dataclass(frozen=True)
class Holder:
    """A process that runs a batch."""

    token: str
    host: str
    pid: int
    process_start: str


@dataclass(frozen=True)
class Lease:
    batch_id: str
    holder: Holder
    acquired_at: datetime
    heartbeat_at: datetime


@dataclass(frozen=True)
class Taken:
    """What `take` found: `lease` is the batch's lease after it (held by the taker when
    `won`); `replaced` is the gone holder it took over from."""

    lease: Lease
    won: bool
    replaced: Holder | None = None


def take(
    conn: Connection,
    *,
    batch_id: str,
    holder: Holder,
    now: datetime,
    gone: Callable[[Lease], bool],
) -> Taken:
    """Take the batch's lease for `holder`: free, held by itself already, or held by one that
    `gone` judges gone (then taken over). Otherwise `won` is false and `lease` says who holds
    it."""
    values = {
        "token": holder.token,
        "host": holder.host,
        "pid": holder.pid,
        "process_start": holder.process_start,
        "acquired_at": now,
        "heartbeat_at": now,
    }
    insert = (sqlite.insert if conn.dialect.name == "sqlite" else postgresql.insert)(L)
    done = conn.execute(
        insert.values(batch_id=batch_id, **values).on_conflict_do_nothing(
            index_elements=["batch_id"]
        )
    )
    if done.rowcount == 1:
        return Taken(Lease(batch_id, holder, now, now), won=True)
    current = lease_of(conn, batch_id)
    if current is None:
        # Released between the two statements: the next try inserts.
        return take(conn, batch_id=batch_id, holder=holder, now=now, gone=gone)
    if current.holder.token == holder.token:
        return Taken(current, won=True)
    if not gone(current):
        return Taken(current, won=False)
    replaced = conn.execute(
        update(L)
        .where(L.c.batch_id == batch_id)
        .where(L.c.token == current.holder.token)
        .where(L.c.heartbeat_at == current.heartbeat_at)
        .values(**values)
    )
    if replaced.rowcount == 1:
        return Taken(Lease(batch_id, holder, now, now), won=True, replaced=current.holder)
    # Another taker was first, or the holder beat its heart: whoever holds it now is alive.
    after = lease_of(conn, batch_id)
    if after is not None and after.holder.token == holder.token:
        return Taken(after, won=True, replaced=current.holder)
    return Taken(after or current, won=False)


def beat(conn: Connection, *, batch_id: str, token: str, now: datetime) -> bool:
    """Renew the holder's heartbeat; false when the lease is no longer its own."""
    done = conn.execute(
        update(L).where(L.c.batch_id == batch_id).where(L.c.token == token).values(heartbeat_at=now)
    )
    return done.rowcount == 1


def release(conn: Connection, *, batch_id: str, token: str) -> None:
    """End the holder's lease (nothing when another holds it)."""
    conn.execute(delete(L).where(L.c.batch_id == batch_id).where(L.c.token == token))


def lease_of(conn: Connection, batch_id: str) -> Lease | None:
    row = conn.execute(select(L).where(L.c.batch_id == batch_id)).mappings().first()
    if row is None:
        return None
    holder = Holder(row["token"], row["host"], row["pid"], row["process_start"])
    return Lease(row["batch_id"], holder, row["acquired_at"], row["heartbeat_at"])
