"""Listings of rollouts and batches, and ids from their prefixes, as SQL text.

Each query is written once, with `:name` parameters, which both sqlite3 and SQLAlchemy's
`text()` take: the store runs them on its own connections (queries.py, lookup.py), and
`rolltap ls` runs them on a plain sqlite3 connection (sqlite_read.py), which spares it
importing SQLAlchemy, its ORM and numpy (most of its start-up; docs/scale.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, Unpack

from .enums import CallStatus, DriftClass, LinkKind, RolloutStatus
from .errors import AmbiguousId, NotFound
from .filters import FilterKeywords, RolloutFilter
from .records import BatchView, RolloutView

Select = Callable[[str, Mapping[str, Any]], Sequence[Sequence[Any]]]
"""Runs one SELECT with `:name` parameters and gives back its rows."""

Kind = Literal["rollout", "batch", "call"]

DRIFT_FILTERS = ("any", "none", *(d.value for d in DriftClass))
"""`RolloutFilter.drift`: any break, none (analysed and unbroken), or a break of one class."""
HACK_FILTERS = ("any", "none", "unchecked")
"""Flagged by some detector, checked and clean, never checked (else: a detector's name)."""

_ROLLOUT_COLUMNS = (
    "id, batch_id, task_id, sample_index, harness, model, status, reward, reward_details, "
    "error, max_calls, max_tokens, created_at, started_at, finished_at, metadata, attempt, "
    "head_hash, head_seq, key_revoked_at, hack_flags"
)
# Correlated, so each rollout's totals come from its own calls through the (rollout_id, seq)
# index; a grouped subquery would aggregate the whole call table for one rollout's lookup.
_ROLLOUTS = f"""SELECT {_ROLLOUT_COLUMNS},
 (SELECT count(*) FROM "call" c WHERE c.rollout_id = rollout.id),
 (SELECT coalesce(sum(c.prompt_tokens + c.completion_tokens), 0)
  FROM "call" c WHERE c.rollout_id = rollout.id),
 (SELECT count(*) FROM "call" c
  WHERE c.rollout_id = rollout.id AND c.status = '{CallStatus.REJECTED.value}')
FROM rollout"""
_BREAKS = (
    "EXISTS (SELECT 1 FROM segment_break sb WHERE sb.rollout_id = rollout.id "
    f"AND sb.kind = '{LinkKind.BREAK.value}'{{}})"
)
_ANALYSED = "EXISTS (SELECT 1 FROM rollout_faithfulness rf WHERE rf.rollout_id = rollout.id)"
_HACK_TEXT = "CAST(hack_flags AS TEXT)"
_COLUMNS = {
    "rollout": ("rollout", "id"),
    "batch": ("rollout", "batch_id"),
    "call": ('"call"', "id"),
}
_SHOWN = 3
"""How many of the ids an ambiguous prefix matches the error names."""


def rollouts(
    select: Select, where: RolloutFilter | None = None, /, **keywords: Unpack[FilterKeywords]
) -> list[RolloutView]:
    """Rollouts matching every filter given, newest first (filters.py: `where`, or its fields
    as keywords)."""
    f = RolloutFilter.of(where, **keywords)
    clauses: list[str] = []
    params: dict[str, Any] = {}
    if f.batch is not None:
        chosen = [f.batch] if isinstance(f.batch, str) else f.batch
        clauses.append(_in("batch_id", "batch", chosen, params))
    if f.status is not None:
        wanted = [f.status] if isinstance(f.status, str) else f.status
        clauses.append(_in("status", "status", [_status_value(s) for s in wanted], params))
    if f.ids is not None:
        clauses.append(_in("id", "id", f.ids, params))
    for column, value, test in (
        ("task_id", f.task, "="),
        ("harness", f.harness, "="),
        ("reward", f.min_reward, ">="),
        ("reward", f.max_reward, "<="),
    ):
        if value is not None:
            name = f"p{len(params)}"
            clauses.append(f"{column} {test} :{name}")
            params[name] = value
    if f.drift is not None:
        clauses.append(_drift_clause(f.drift, params))
    if f.hack is not None:
        clauses.append(_hack_clause(f.hack, params))
    sql = _ROLLOUTS + (f" WHERE {' AND '.join(clauses)}" if clauses else "")
    sql += " ORDER BY created_at, id" if f.oldest_first else " ORDER BY created_at DESC, id DESC"
    if f.limit is not None or f.offset:
        # SQLite takes OFFSET only after a LIMIT; -1 is its "no limit", PostgreSQL's is ALL.
        sql += " LIMIT :limit OFFSET :offset"
        params["limit"] = f.limit if f.limit is not None else 2**62
        params["offset"] = f.offset
    return [_view(row) for row in select(sql, params)]


def _view(row: Sequence[Any]) -> RolloutView:
    """A row of `_ROLLOUTS`, as either driver gives it: SQLite's times and JSON as text."""
    return RolloutView(
        id=row[0],
        batch_id=row[1],
        task_id=row[2],
        sample_index=row[3],
        harness=row[4],
        model=row[5],
        status=RolloutStatus(row[6]),
        reward=row[7],
        reward_details=_json(row[8]),
        error=row[9],
        max_calls=row[10],
        max_tokens=row[11],
        created_at=_time(row[12]),
        started_at=_time_or_none(row[13]),
        finished_at=_time_or_none(row[14]),
        meta=_json(row[15]) or {},
        attempt=row[16],
        head_hash=row[17],
        head_seq=row[18],
        key_revoked_at=_time_or_none(row[19]),
        hack_flags=_json(row[20]),
        n_calls=int(row[21]),
        n_tokens=int(row[22]),
        n_rejected=int(row[23]),
    )


def batches(
    select: Select, *, pass_reward: float = 1.0, limit: int | None = None, offset: int = 0
) -> list[BatchView]:
    """Batches, the most recently started first, with their rollouts counted by status and
    their rewards summed up. `pass_reward`: the reward at which a sample counts as passed."""
    newest = (
        "SELECT batch_id FROM rollout WHERE batch_id IS NOT NULL GROUP BY batch_id "
        "ORDER BY max(created_at) DESC, batch_id LIMIT :limit OFFSET :offset"
    )
    page = {"limit": limit if limit is not None else 2**62, "offset": offset}
    ids = [row[0] for row in select(newest, page)]
    if not ids:
        return []
    params: dict[str, Any] = {"pass": pass_reward}
    chosen = _in("batch_id", "batch", ids, params)
    totals = select(
        "SELECT batch_id, count(DISTINCT task_id), count(reward), sum(reward), "
        "sum(CASE WHEN reward >= :pass THEN 1 ELSE 0 END), min(created_at), max(finished_at) "
        f"FROM rollout WHERE {chosen} GROUP BY batch_id",
        params,
    )
    by_status: dict[str, dict[str, int]] = {batch_id: {} for batch_id in ids}
    counted = (
        f"SELECT batch_id, status, count(*) FROM rollout WHERE {chosen} GROUP BY batch_id, status"
    )
    for batch_id, status, n in select(counted, params):
        by_status[batch_id][status] = int(n)
    views = {
        batch_id: BatchView(
            batch_id=batch_id,
            rollouts=sum(by_status[batch_id].values()),
            tasks=int(tasks),
            statuses=by_status[batch_id],
            rewarded=int(rewarded),
            mean_reward=None if not rewarded else float(total) / int(rewarded),
            passed=int(passed or 0),
            created_at=_time(first),
            finished_at=_time_or_none(last),
        )
        for batch_id, tasks, rewarded, total, passed, first, last in totals
    }
    return [views[batch_id] for batch_id in ids]


def resolve_id(select: Select, kind: Kind, given: str) -> str:
    """The id `given` is, or the only one it begins; NotFound when none, AmbiguousId when several.
    Rollout and call ids (ULIDs, upper case) also match a prefix typed in lower case."""
    table, column = _COLUMNS[kind]
    if given and select(
        f"SELECT {column} FROM {table} WHERE {column} = :id LIMIT 1", {"id": given}
    ):
        return given
    spellings = [given] if kind == "batch" else list(dict.fromkeys((given, given.upper())))
    begins = f"FROM {table} WHERE substr({column}, 1, :n) = :prefix"
    for prefix in spellings if given else []:
        params = {"n": len(prefix), "prefix": prefix, "limit": _SHOWN + 1}
        found = [
            str(row[0])
            for row in select(
                f"SELECT DISTINCT {column} {begins} ORDER BY {column} LIMIT :limit", params
            )
        ]
        if len(found) == 1:
            return found[0]
        if found:
            n = select(f"SELECT count(DISTINCT {column}) {begins}", params)[0][0]
            shown = ", ".join(found[:_SHOWN]) + (", ..." if n > _SHOWN else "")
            raise AmbiguousId(
                f"{given!r} begins {n} {kind} ids ({shown}): give more of the {kind} id"
            )
    raise NotFound(f"no {kind} {given!r}")


def _in(column: str, name: str, values: Sequence[Any], params: dict[str, Any]) -> str:
    if not values:
        return "1 = 0"
    names = [f"{name}_{i}" for i in range(len(values))]
    params.update(zip(names, values, strict=True))
    return f"{column} IN ({', '.join(':' + n for n in names)})"


def _drift_clause(drift: str, params: dict[str, Any]) -> str:
    if drift not in DRIFT_FILTERS:
        raise ValueError(f"unknown drift filter {drift!r}; use one of {', '.join(DRIFT_FILTERS)}")
    if drift == "any":
        return _BREAKS.format("")
    if drift == "none":
        return f"{_ANALYSED} AND NOT {_BREAKS.format('')}"
    params["drift"] = drift
    return _BREAKS.format(" AND sb.drift = :drift")


def _hack_clause(hack: str, params: dict[str, Any]) -> str:
    if hack == "unchecked":
        return f"(hack_flags IS NULL OR {_HACK_TEXT} = 'null')"
    if hack == "none":
        return f"{_HACK_TEXT} = '[]'"
    flagged = f"hack_flags IS NOT NULL AND {_HACK_TEXT} NOT IN ('[]', 'null')"
    if hack == "any":
        return f"({flagged})"
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", hack):
        raise ValueError(f"hack filter {hack!r}: use {', '.join(HACK_FILTERS)} or a detector name")
    name = hack.replace("_", "\\_")
    # The stored JSON text, as written (json.dumps) or compacted: `"detector": "name"`.
    params["hack_spaced"] = f'%"detector": "{name}"%'
    params["hack_compact"] = f'%"detector":"{name}"%'
    like = f"{_HACK_TEXT} LIKE :hack_{{}} ESCAPE '\\'"
    return f"({flagged} AND ({like.format('spaced')} OR {like.format('compact')}))"


def _status_value(word: str) -> str:
    """A status as stored: an old word (`succeeded`) reads as its new one."""
    try:
        return RolloutStatus(word).value
    except ValueError:
        return word


def _json(value: Any) -> Any:
    # SQLite and SQLAlchemy's asyncpg codec hand JSON columns over as text.
    return json.loads(value) if isinstance(value, str) else value


def _time(value: datetime | str) -> datetime:
    # SQLite holds SQLAlchemy's naive UTC text ("2025-01-02 03:04:05.123456").
    t = datetime.fromisoformat(value) if isinstance(value, str) else value
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _time_or_none(value: datetime | str | None) -> datetime | None:
    return None if value is None else _time(value)
