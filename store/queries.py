"""Queries: small typed functions over a Connection.

They are synchronous so one body serves every caller: the SQLite writer thread calls them
directly, async code runs them with `AsyncConnection.run_sync` (aiosqlite or asyncpg).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, Select, bindparam, func, select
from sqlalchemy.engine import Connection

from rolltap.store import compress
from rolltap.store.delta import KnownCall, StoredPrompt, rebuild_prompts
from rolltap.store.errors import NotFound
from rolltap.store.models import (
    CallDialect,
    CallStatus,
    Capture,
    RolloutStatus,
    call_body_table,
    call_table,
    choice_table,
    rollout_table,
)
from rolltap.store.packing import IdArray, unpack_ids, unpack_logprobs
from rolltap.store.records import (
    CallBodies,
    CallTokens,
    CallView,
    ChoiceTokens,
    RolloutView,
)

R = rollout_table
C = call_table
CH = choice_table
B = call_body_table

# Correlated, so each rollout's totals come from its own calls through the (rollout_id, seq)
# index; a grouped subquery would aggregate the whole call table for one rollout's lookup.
_N_CALLS = select(func.count()).where(C.c.rollout_id == R.c.id).scalar_subquery()
_N_TOKENS = (
    select(func.coalesce(func.sum(C.c.prompt_tokens + C.c.completion_tokens), 0))
    .where(C.c.rollout_id == R.c.id)
    .scalar_subquery()
)


def _rollouts() -> Select[Any]:
    return select(R, _N_CALLS.label("n_calls"), _N_TOKENS.label("n_tokens"))


def _rollout_view(row: Row[Any]) -> RolloutView:
    m = row._mapping
    return RolloutView(
        id=m[R.c.id],
        batch_id=m[R.c.batch_id],
        task_id=m[R.c.task_id],
        sample_index=m[R.c.sample_index],
        harness=m[R.c.harness],
        model=m[R.c.model],
        status=RolloutStatus(m[R.c.status]),
        reward=m[R.c.reward],
        reward_details=m[R.c.reward_details],
        error=m[R.c.error],
        max_calls=m[R.c.max_calls],
        max_tokens=m[R.c.max_tokens],
        created_at=m[R.c.created_at],
        started_at=m[R.c.started_at],
        finished_at=m[R.c.finished_at],
        meta=m[R.c["metadata"]] or {},
        n_calls=int(m["n_calls"]),
        n_tokens=int(m["n_tokens"]),
        attempt=m[R.c.attempt],
    )


def rollout(conn: Connection, rollout_id: str) -> RolloutView:
    row = (conn.execute(_rollouts().where(R.c.id == rollout_id))).first()
    if row is None:
        raise NotFound(f"no rollout {rollout_id!r}")
    return _rollout_view(row)


def rollout_by_key_hash(conn: Connection, key_hash: str) -> RolloutView | None:
    row = (conn.execute(_rollouts().where(R.c.key_hash == key_hash))).first()
    return None if row is None else _rollout_view(row)


def rollouts(
    conn: Connection,
    *,
    batch: str | Sequence[str] | None = None,
    status: str | Sequence[str] | None = None,
    ids: Sequence[str] | None = None,
    limit: int | None = None,
    oldest_first: bool = False,
) -> list[RolloutView]:
    query = _rollouts()
    if batch is not None:
        query = query.where(R.c.batch_id.in_([batch] if isinstance(batch, str) else batch))
    if status is not None:
        query = query.where(R.c.status.in_([status] if isinstance(status, str) else status))
    if ids is not None:
        query = query.where(R.c.id.in_(ids))
    order = (R.c.created_at, R.c.id) if oldest_first else (R.c.created_at.desc(), R.c.id.desc())
    query = query.order_by(*order)
    if limit is not None:
        query = query.limit(limit)
    return [_rollout_view(row) for row in conn.execute(query)]


_CALL_COLUMNS = [c for c in C.c if c.name not in ("prompt_suffix",)]


def _call_view(row: Row[Any]) -> CallView:
    m = row._mapping
    return CallView(
        id=m["id"],
        rollout_id=m["rollout_id"],
        seq=m["seq"],
        dialect=CallDialect(m["dialect"]),
        purpose=m["purpose"],
        model=m["model"],
        backend=m["backend"],
        status=CallStatus(m["status"]),
        http_status=m["http_status"],
        error=m["error"],
        stream=bool(m["stream"]),
        capture=Capture(m["capture"]),
        received_at=m["received_at"],
        dispatched_at=m["dispatched_at"],
        first_token_at=m["first_token_at"],
        finished_at=m["finished_at"],
        weight_version=m["weight_version"],
        finish_reason=m["finish_reason"],
        usage=m["usage"],
        retry_count=m["retry_count"],
        body_hash=m["body_hash"],
        retry_of=m["retry_of"],
        prompt_tokens=m["prompt_tokens"],
        completion_tokens=m["completion_tokens"],
        n_choices=m["n_choices"],
    )


def calls(conn: Connection, rollout_id: str) -> list[CallView]:
    rows = conn.execute(
        select(*_CALL_COLUMNS).where(C.c.rollout_id == rollout_id).order_by(C.c.seq)
    )
    return [_call_view(row) for row in rows]


def call(conn: Connection, call_id: str) -> CallView:
    row = (conn.execute(select(*_CALL_COLUMNS).where(C.c.id == call_id))).first()
    if row is None:
        raise NotFound(f"no call {call_id!r}")
    return _call_view(row)


def call_bodies(conn: Connection, call_id: str) -> CallBodies:
    row = (conn.execute(select(B).where(B.c.call_id == call_id))).first()
    if row is None:
        raise NotFound(f"no call {call_id!r}")
    return CallBodies(
        request=compress.inflate(row.request),
        engine_request=compress.inflate(row.engine_request),
        response=compress.inflate(row.response),
    )


def rollout_tokens(
    conn: Connection, rollout_id: str, *, up_to_seq: int | None = None
) -> dict[str, CallTokens]:
    """Full token arrays of every call of a rollout (in seq order), rebuilt from the deltas."""
    prompt_query = (
        select(
            C.c.id,
            C.c.prompt_parent_id,
            C.c.prompt_parent_choice,
            C.c.prompt_shared,
            C.c.prompt_suffix,
        )
        .where(C.c.rollout_id == rollout_id)
        .order_by(C.c.seq)
    )
    choice_query = (
        select(CH.c.call_id, CH.c.idx, CH.c.finish_reason, CH.c.token_ids, CH.c.logprobs)
        .join(C, C.c.id == CH.c.call_id)
        .where(C.c.rollout_id == rollout_id)
        .order_by(C.c.seq, CH.c.idx)
    )
    if up_to_seq is not None:
        prompt_query = prompt_query.where(C.c.seq <= up_to_seq)
        choice_query = choice_query.where(C.c.seq <= up_to_seq)
    stored = [
        StoredPrompt(r[0], r[1], r[2], r[3], unpack_ids(r[4])) for r in conn.execute(prompt_query)
    ]
    choices: dict[str, list[ChoiceTokens]] = {s.call_id: [] for s in stored}
    completions: dict[tuple[str, int], IdArray] = {}
    for call_id, idx, finish, ids_blob, lp_blob in conn.execute(choice_query):
        if call_id not in choices:
            # Committed by another writer after the first statement read the prompts.
            continue
        ids = unpack_ids(ids_blob)
        completions[(call_id, idx)] = ids
        choices[call_id].append(ChoiceTokens(idx, ids, unpack_logprobs(lp_blob), finish))
    prompts = rebuild_prompts(stored, completions)
    return {cid: CallTokens(cid, prompts[cid], choices[cid]) for cid in prompts}


def call_tokens(conn: Connection, call_id: str) -> CallTokens:
    row = (conn.execute(select(C.c.rollout_id, C.c.seq).where(C.c.id == call_id))).first()
    if row is None:
        raise NotFound(f"no call {call_id!r}")
    return (rollout_tokens(conn, row.rollout_id, up_to_seq=row.seq))[call_id]


def recent_known_calls(conn: Connection, rollout_id: str, n: int) -> list[KnownCall]:
    """The last `n` calls of a rollout with full arrays, oldest first (for the delta cache)."""
    everything = rollout_tokens(conn, rollout_id)
    last = list(everything.values())[-n:] if n else []
    return [
        KnownCall(t.call_id, t.prompt_ids, {c.index: c.token_ids for c in t.choices}) for t in last
    ]


_LOCK_ROLLOUTS = (
    select(R.c.id)
    .where(R.c.id.in_(bindparam("ids", expanding=True)))
    .order_by(R.c.id)
    .with_for_update()
)
_LAST_SEQS = (
    select(C.c.rollout_id, func.max(C.c.seq))
    .where(C.c.rollout_id.in_(bindparam("ids", expanding=True)))
    .group_by(C.c.rollout_id)
)


def lock_next_seqs(conn: Connection, rollout_ids: Sequence[str]) -> dict[str, int]:
    """Next free seq per rollout, locking the rollouts' rows until the transaction ends.

    The row lock serialises writers of the same rollout across processes on PostgreSQL; on
    SQLite the writer's BEGIN IMMEDIATE already holds the database's write lock. The maximum is
    read by a second statement: one statement would keep the snapshot it took before waiting.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(_LOCK_ROLLOUTS, {"ids": list(rollout_ids)})
    rows = conn.execute(_LAST_SEQS, {"ids": list(rollout_ids)})
    last: dict[str, int | None] = {rid: value for rid, value in rows}
    return {rid: int(last.get(rid) or 0) + 1 for rid in rollout_ids}


def latest_call_with_body(
    conn: Connection, rollout_id: str, body_hash: str
) -> tuple[str, str] | None:
    """(id, status) of the latest call of the rollout whose request body had this hash."""
    row = (
        conn.execute(
            select(C.c.id, C.c.status)
            .where(C.c.rollout_id == rollout_id, C.c.body_hash == body_hash)
            .order_by(C.c.seq.desc())
            .limit(1)
        )
    ).first()
    return None if row is None else (row[0], row[1])
