"""Queries: small typed functions over a Connection.

They are synchronous so one body serves every caller: the SQLite writer thread calls them
directly, async code runs them with `AsyncConnection.run_sync` (aiosqlite or asyncpg).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Row,
    Select,
    bindparam,
    func,
    literal,
    null,
    or_,
    select,
    text,
)
from sqlalchemy.engine import Connection, Dialect

from . import compress, listing
from .chain import GENESIS_HEX, prev_of
from .delta import KnownCall, StoredPrompt, rebuild_prompts
from .errors import NotFound
from .filters import RolloutFilter
from .models import (
    CallDialect,
    CallStatus,
    Capture,
    RolloutStatus,
    call_body_table,
    call_table,
    choice_table,
    lineage_turn_table,
    rollout_faithfulness_table,
    rollout_table,
    segment_break_table,
)
from .packing import IdArray, unpack_ids, unpack_logprobs
from .records import (
    BatchView,
    CallBodies,
    CallReceipt,
    CallTokens,
    CallView,
    ChoiceTokens,
    RolloutAnalysis,
    RolloutView,
    StoredTurn,
)

R = rollout_table
C = call_table
CH = choice_table
B = call_body_table
SB = segment_break_table
RF = rollout_faithfulness_table
LT = lineage_turn_table

DRIFT_FILTERS = listing.DRIFT_FILTERS
HACK_FILTERS = listing.HACK_FILTERS

# Correlated, so each rollout's totals come from its own calls through the (rollout_id, seq)
# index; a grouped subquery would aggregate the whole call table for one rollout's lookup.
_N_CALLS = select(func.count()).where(C.c.rollout_id == R.c.id).scalar_subquery()
_N_TOKENS = (
    select(func.coalesce(func.sum(C.c.prompt_tokens + C.c.completion_tokens), 0))
    .where(C.c.rollout_id == R.c.id)
    .scalar_subquery()
)


_N_REJECTED = (
    select(func.count())
    .where(C.c.rollout_id == R.c.id, C.c.status == CallStatus.REJECTED.value)
    .scalar_subquery()
)


def _rollouts() -> Select[Any]:
    return select(
        R,
        _N_CALLS.label("n_calls"),
        _N_TOKENS.label("n_tokens"),
        _N_REJECTED.label("n_rejected"),
    )


_COUNTS = ("n_calls", "n_tokens", "n_rejected")


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
        n_rejected=int(m["n_rejected"]),
        attempt=m[R.c.attempt],
        head_hash=m[R.c.head_hash],
        head_seq=m[R.c.head_seq],
        key_revoked_at=m[R.c.key_revoked_at],
        hack_flags=m[R.c.hack_flags],
    )


def rollout(conn: Connection, rollout_id: str) -> RolloutView:
    row = (conn.execute(_rollouts().where(R.c.id == rollout_id))).first()
    if row is None:
        raise NotFound(f"no rollout {rollout_id!r}")
    return _rollout_view(row)


def rollout_by_key_hash(
    conn: Connection, key_hash: str, *, counted: bool = True
) -> RolloutView | None:
    """`counted=False`: its calls uncounted (n_calls, n_tokens and n_rejected read 0), so the
    lookup is one row where the counts pass over every call the rollout made."""
    query = _rollouts() if counted else select(R, *(literal(0).label(n) for n in _COUNTS))
    row = (conn.execute(query.where(R.c.key_hash == key_hash))).first()
    return None if row is None else _rollout_view(row)


def rollouts(conn: Connection, where: RolloutFilter, /) -> list[RolloutView]:
    """Rollouts matching every filter given (listing.rollouts, the one query for both)."""
    return listing.rollouts(text_select(conn), where)


def analyses(conn: Connection, rollout_ids: Sequence[str]) -> dict[str, RolloutAnalysis]:
    """The stored faithfulness summary of each rollout that has one."""
    rows = conn.execute(select(RF).where(RF.c.rollout_id.in_(rollout_ids)))
    return {
        r.rollout_id: RolloutAnalysis(
            rollout_id=r.rollout_id,
            analyzed_at=r.analyzed_at,
            calls=r.calls,
            segments=r.segments,
            sampled_tokens=r.sampled_tokens,
            lost_tokens=r.lost_tokens,
            share=r.share,
            breaks=dict(r.breaks or {}),
            side_calls=r.side_calls,
        )
        for r in rows
    }


def batches(
    conn: Connection, *, pass_reward: float = 1.0, limit: int | None = None, offset: int = 0
) -> list[BatchView]:
    """Batches, newest first (listing.batches)."""
    return listing.batches(text_select(conn), pass_reward=pass_reward, limit=limit, offset=offset)


def text_select(conn: Connection) -> listing.Select:
    """`conn` running listing.py's SQL text (its `:name` parameters are SQLAlchemy's too)."""
    return lambda sql, params: conn.execute(text(sql), params).all()


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
        resumes=m["resumes"],
        bridge=m["bridge"],
        tool_parse=m["tool_parse"],
        weight_spans=m["weight_spans"],
        weights_digest=m["weights_digest"],
        digest=m["digest"],
        hash=m["hash"],
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


def rollout_bodies(
    conn: Connection, rollout_id: str, *, engine_requests: bool = False
) -> dict[str, CallBodies]:
    """Every call's recorded bodies, by call id (the engine's requests only when asked)."""
    engine = B.c.engine_request if engine_requests else null()
    rows = conn.execute(
        select(B.c.call_id, B.c.request, engine, B.c.response)
        .join(C, C.c.id == B.c.call_id)
        .where(C.c.rollout_id == rollout_id)
        .order_by(C.c.seq)
    )
    return {
        call_id: CallBodies(
            compress.inflate(request), compress.inflate(engine_request), compress.inflate(response)
        )
        for call_id, request, engine_request, response in rows
    }


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


def lineage_turns(
    conn: Connection, rollout_id: str, request: bytes, limit: int = 8
) -> list[StoredTurn]:
    """The rollout's token-in calls that answered the messages hashed as `request`, latest
    first, with their ids (proxy/tokenin/lineage.py)."""
    rows = conn.execute(
        select(LT.c.call_id, LT.c.answer, LT.c.context)
        .join(C, C.c.id == LT.c.call_id)
        .where(LT.c.rollout_id == rollout_id, LT.c.request == request.hex())
        .order_by(C.c.seq.desc())
        .limit(limit)
    ).all()
    if not rows:
        return []
    tokens = rollout_tokens(conn, rollout_id)
    turns = []
    for call_id, answer, context in rows:
        held = tokens.get(call_id)
        first = next((c for c in held.choices if c.index == 0), None) if held else None
        if held is None or first is None:
            continue
        turns.append(
            StoredTurn(
                call_id,
                bytes.fromhex(answer),
                bytes.fromhex(context),
                held.prompt_ids,
                first.token_ids,
                first.finish_reason,
            )
        )
    return turns


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
# Each rollout's last seq as a correlated max: one index seek per rollout on SQLite and
# PostgreSQL alike, where a grouped max over the rollouts' calls reads every call they have.
_LAST_SEQ = select(func.max(C.c.seq)).where(C.c.rollout_id == R.c.id).correlate(R).scalar_subquery()
_CHAIN_ENDS = (
    select(R.c.id, C.c.seq, C.c.hash)
    .select_from(R.join(C, (C.c.rollout_id == R.c.id) & (C.c.seq == _LAST_SEQ)))
    .where(R.c.id.in_(bindparam("ids", expanding=True)))
)


@dataclass(frozen=True)
class ChainEnd:
    """Where a rollout's next call goes: its seq, and the hash it chains to (chain.py)."""

    next_seq: int
    prev: bytes


def lock_chain_ends(conn: Connection, rollout_ids: Sequence[str]) -> dict[str, ChainEnd]:
    """Next free seq and previous hash per rollout, locking the rollouts' rows until the
    transaction ends.

    The row lock serialises writers of the same rollout across processes on PostgreSQL; on
    SQLite the writer's BEGIN IMMEDIATE already holds the database's write lock. The last call is
    read by a second statement: one statement would keep the snapshot it took before waiting.
    """
    ids = tuple(rollout_ids)
    if conn.dialect.name == "postgresql":
        _by_ids(conn, "lock", ids)
    last = {rid: (seq, stored) for rid, seq, stored in _by_ids(conn, "ends", ids)}
    ends = {}
    for rid in rollout_ids:
        seq, stored = last.get(rid, (0, None))
        ends[rid] = ChainEnd(int(seq) + 1, prev_of(stored))
    return ends


_BY_IDS = {"lock": _LOCK_ROLLOUTS, "ends": _CHAIN_ENDS}


def _by_ids(conn: Connection, name: str, ids: tuple[str, ...]) -> Any:
    """Run a statement of _BY_IDS. Every call's transaction does: as driver SQL rendered once
    per dialect and id count it skips Core's per-execution expansion of the IN list, a third of
    a lone call's commit."""
    if conn.dialect.paramstyle not in ("qmark", "numeric_dollar"):
        return conn.execute(_BY_IDS[name], {"ids": list(ids)})
    sql = _rendered(name, conn.dialect, len(ids))
    if conn.dialect.driver != "pysqlite":
        return conn.exec_driver_sql(sql, ids)
    # The connection's own sqlite3 cursor, in the same transaction: Core's execution context
    # and result cost a lone call more than SQLite's two index seeks (as the writer's inserts).
    cursor = conn.connection.cursor()
    try:
        return cursor.execute(sql, ids).fetchall()
    finally:
        cursor.close()


@functools.lru_cache(maxsize=256)
def _rendered(name: str, dialect: Dialect, n: int) -> str:
    """A statement of _BY_IDS as the driver's SQL for `n` ids, its only (positional) parameters."""
    compiled = (
        _BY_IDS[name]
        .params(ids=[""] * n)
        .compile(dialect=dialect, compile_kwargs={"render_postcompile": True})
    )
    assert compiled.positiontup == [f"ids_{i}" for i in range(1, n + 1)]
    return str(compiled)


def chain_end(conn: Connection, rollout_id: str) -> tuple[int, str]:
    """(seq, hash) of a rollout's last call; (0, GENESIS_HEX) when it has none. Lock first."""
    row = conn.execute(_CHAIN_ENDS, {"ids": [rollout_id]}).first()
    if row is None:
        return 0, GENESIS_HEX
    return int(row.seq), row.hash if row.hash is not None else GENESIS_HEX


def last_backend(conn: Connection, rollout_id: str) -> str | None:
    """The backend that served the rollout's latest call that reached one."""
    return conn.execute(
        select(C.c.backend)
        .where(C.c.rollout_id == rollout_id, C.c.backend.is_not(None))
        .order_by(C.c.seq.desc())
        .limit(1)
    ).scalar()


def first_weight_version(conn: Connection, rollout_id: str) -> str | None:
    """The weight version of the rollout's oldest answered call that has one."""
    return conn.execute(
        select(C.c.weight_version)
        .where(
            C.c.rollout_id == rollout_id,
            C.c.status == CallStatus.OK.value,
            C.c.weight_version.is_not(None),
        )
        .order_by(C.c.seq)
        .limit(1)
    ).scalar()


def idle_unbatched(conn: Connection, cutoff: datetime) -> list[str]:
    """Rollouts outside any batch (made by hand, by open mode or POST /admin/rollouts) still
    pending or running whose latest call, or creation when they have none, is before `cutoff`:
    nobody will finish them (runner/batch.py and the service end their own)."""
    latest = select(func.max(C.c.received_at)).where(C.c.rollout_id == R.c.id).scalar_subquery()
    return list(
        conn.execute(
            select(R.c.id).where(
                R.c.batch_id.is_(None),
                R.c.status.in_([RolloutStatus.PENDING.value, RolloutStatus.RUNNING.value]),
                R.c.created_at < cutoff,
                or_(latest.is_(None), latest < cutoff),
            )
        ).scalars()
    )


def lock_rollout(conn: Connection, rollout_id: str) -> None:
    """Hold a rollout's row until the transaction ends (PostgreSQL; SQLite's writer holds the
    whole database already), so no other writer appends a call meanwhile."""
    if conn.dialect.name == "postgresql":
        conn.execute(_LOCK_ROLLOUTS, {"ids": [rollout_id]})


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


def call_receipts(conn: Connection, call_ids: Sequence[str | None]) -> dict[str, CallReceipt]:
    """Receipts of those calls that are already stored (a retried batch asks)."""
    wanted = [i for i in call_ids if i]
    if not wanted:
        return {}
    rows = conn.execute(select(C.c.id, C.c.seq).where(C.c.id.in_(wanted)))
    return {call_id: CallReceipt(call_id, seq) for call_id, seq in rows}


def existing_rollouts(conn: Connection, rollout_ids: Sequence[str]) -> set[str]:
    if not rollout_ids:
        return set()
    return set(conn.execute(select(R.c.id).where(R.c.id.in_(list(rollout_ids)))).scalars())
